"""Episodes kept for people to read (core/transcript.py): every evaluation's, and a bounded sample of training's.

What must hold:
- An evaluation writes every episode it ran to `episodes.jsonl` in its output folder, one transcript per line.
  The lines of one policy, env family and turn limit replace those an earlier evaluation into the same folder
  wrote for the same three (a rerun does not mix two evaluations); other lines stay.
- Its report shows, per level, one success and one failure of the model (or of the first policy it has), short
  (`report_examples`).
- A training run keeps, every `logging.episodes_every` steps, at most `logging.episodes_per_sample` of the
  episodes that step trained (failures and successes alternating, so both are seen) in `<output_dir>/episodes.jsonl`
  and, with wandb on, as the table `episodes`; once the file holds `logging.episodes_max_mb`, no more are kept
  (said once in the log, and counted in the metric `episodes/skipped`).
- Cost: decoding a few episodes' tokens every few steps, on the driver; nothing here is ever trained on.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable

from core.chat import ChatFormat
from core.trajectory import Trajectory
from core.transcript import as_text, clip_text, episode_record
from environments.registry import get_family

log = logging.getLogger("agentgym.episodes")

EPISODES_FILE = "episodes.jsonl"
_CHATS: dict[str, ChatFormat] = {}


def chat_for(tokenizer_dir: str) -> ChatFormat:
    """The chat format of a model folder's tokenizer (loaded once per process)."""
    if tokenizer_dir not in _CHATS:
        from transformers import AutoTokenizer

        _CHATS[tokenizer_dir] = ChatFormat(AutoTokenizer.from_pretrained(tokenizer_dir))
    return _CHATS[tokenizer_dir]


def label_of(family: str, item_id: str) -> str:
    """The item's level or task where the family names one (eval reports break results down by it)."""
    try:
        hook = get_family(family).extras.get("item_label")
    except KeyError:
        return family
    return hook(item_id) if hook else family


def records_of(trajs: Iterable[Trajectory], tokenizer_dir: str, policy: str, max_chars: int = 1000,
               extra: dict[str, Any] | None = None) -> list[dict]:
    chat = chat_for(tokenizer_dir)
    return [episode_record(t, chat, policy=policy, label=label_of(t.env, t.item_id), max_chars=max_chars,
                           extra=extra) for t in trajs]


def write_eval_episodes(out_dir: Path, records: list[dict], policy: str, family: str, horizon: int) -> Path:
    """Write one evaluation's episodes of (policy, family, horizon) to `<out_dir>/episodes.jsonl`, replacing that
    triple's earlier lines there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / EPISODES_FILE
    kept = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                old = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash: the evaluation it belonged to is being replaced or gone
            if (old.get("policy"), old.get("env"), old.get("horizon")) != (policy, family, horizon):
                kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept + [json.dumps(r) for r in records]))
    tmp.replace(path)
    return path


def report_examples(records: list[dict], max_chars: int = 320) -> dict[str, dict[str, str]]:
    """Per level: the first success and the first failure among `records`, each as short text (or absent)."""
    out: dict[str, dict[str, str]] = {}
    for record in records:
        kind = "success" if record["success"] else "failure"
        level = out.setdefault(record["level"], {})
        if kind not in level:
            level[kind] = as_text(record, max_chars=max_chars)
    return out


def pick_sample(trajs: list[Trajectory], count: int) -> list[Trajectory]:
    """Up to `count` of `trajs`, failures and successes alternating (a failure first), in batch order."""
    failures = [t for t in trajs if not t.metrics.get("success", 0.0)]
    successes = [t for t in trajs if t.metrics.get("success", 0.0)]
    picked = []
    while len(picked) < count and (failures or successes):
        for pool in (failures, successes):
            if pool and len(picked) < count:
                picked.append(pool.pop(0))
    return picked


class TrainingEpisodes:
    """The training run's sample of transcripts: `<run>/episodes.jsonl` and, with wandb, the `episodes` table."""

    def __init__(self, path: Path, tokenizer_dir: str, every: int, per_sample: int, max_mb: float,
                 wandb: Any = None):
        self.path, self.tokenizer_dir = path, tokenizer_dir
        self.every, self.per_sample, self.max_bytes = every, per_sample, int(max_mb * (1 << 20))
        self.wandb = wandb
        self.written = path.stat().st_size if path.exists() else 0  # a resumed run counts what it kept
        self.skipped = 0
        self._said_full = False

    def due(self, step: int) -> bool:
        return self.every > 0 and self.per_sample > 0 and step % self.every == 0

    def keep(self, step: int, trajs: list[Trajectory]) -> dict[str, float]:
        """Keep the sample of step `step`'s trained episodes if due; returns metrics (`episodes/...`)."""
        if not self.due(step):
            return {}
        picked = pick_sample(trajs, self.per_sample)
        lines = [json.dumps(r) for r in records_of(picked, self.tokenizer_dir, "model", extra={"step": step})]
        size = sum(len(line.encode()) + 1 for line in lines)
        if self.written + size > self.max_bytes:
            self.skipped += len(lines)
            if not self._said_full:
                log.warning("%s holds %.1f MB, the cap (logging.episodes_max_mb): no more training episodes "
                            "are kept from step %d on", self.path, self.written / (1 << 20), step)
                self._said_full = True
            return {"episodes/kept": 0.0, "episodes/skipped": float(self.skipped)}
        with open(self.path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        self.written += size
        if self.wandb is not None:
            self.wandb.log_episodes(step, [json.loads(line) for line in lines])
        return {"episodes/kept": float(len(lines)), "episodes/skipped": float(self.skipped)}


def table_rows(records: list[dict], max_chars: int = 400) -> tuple[list[str], list[list]]:
    """Columns and rows of the wandb table of transcripts."""
    columns = ["step", "item_id", "level", "ended", "reward", "turns", "transcript"]
    rows = [[r.get("step", 0), r["item_id"], r["level"], r["ended"], r["reward"], r["num_turns"],
             clip_text(as_text(r, max_chars=max_chars, head_turns=50, tail_turns=0), 20 * max_chars)]
            for r in records]
    return columns, rows
