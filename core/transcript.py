"""Transcripts a person can read: one episode as its turns in text, decoded from the record's tokens.

What must hold:
- This is for people only. The text is decoded from the trajectory's token ids with the tokenizer; nothing
  here is ever trained on (the learner trains on the ids and never re-tokenizes text).
- Turn k holds the observation the agent saw before its k-th reply (turn 0: the task's first observation),
  the reply as the env received it (decoded without special tokens, as core/rollout.py decodes it), the
  action the env parsed from it ("" for none; None when the record did not carry actions) and its reward.
  An observation that no reply followed (the env's answer to the last action) is not in the record, so the
  episode's end is told by its `termination` and `success`.
- Every text is cut to `max_chars` (its head and tail kept, with the number of characters left out said), so a
  record's size is bounded by its turns times `max_chars`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from core.chat import ChatFormat
from core.trajectory import Trajectory


def clip_text(text: str, max_chars: int) -> str:
    """`text` cut to about `max_chars`: its head and tail, and how many characters were left out between."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    return f"{text[:head]} [... {len(text) - head - tail} chars ...] {text[-tail:]}"


def ended(termination: str, success: bool) -> str:
    """Why the episode ended, in one word a reader needs: `success`, `failure` (the env ended it unsolved), or
    the termination otherwise (horizon, context_limit, env_error, env_timeout, aborted, lost)."""
    if termination == "done":
        return "success" if success else "failure"
    return termination


def turn_spans(traj: Trajectory) -> list[tuple[int, int, int]]:
    """Per turn k: (start of the context before it, first sampled token of the reply, end of the reply)."""
    spans = []
    sampled = np.flatnonzero(traj.loss_mask)
    context_start = 0
    for end in traj.turn_ends.tolist():
        at = int(np.searchsorted(sampled, context_start))
        first = min(int(sampled[at]), end) if at < sampled.size else end
        spans.append((context_start, first, end))
        context_start = end
    return spans


def episode_record(traj: Trajectory, chat: ChatFormat, *, policy: str, label: str = "",
                   max_chars: int = 1000, extra: dict[str, Any] | None = None) -> dict:
    """The transcript of `traj` as one JSON-ready dict. `policy`: what acted (model, untrained, random...);
    `label`: the item's level or task (empty: the env family)."""
    tok = chat.tok
    turns = []
    actions = list(traj.turn_actions)
    rewards = traj.turn_rewards.tolist()
    for k, (context_start, first, end) in enumerate(turn_spans(traj)):
        context = tok.decode(traj.tokens[context_start:first].tolist(), skip_special_tokens=False,
                             clean_up_tokenization_spaces=False)
        reply = tok.decode(traj.tokens[first:end].tolist(), skip_special_tokens=True,
                           clean_up_tokenization_spaces=False)
        turns.append({"observation": clip_text(chat.user_content(context), max_chars),
                      "reply": clip_text(reply, max_chars),
                      "action": actions[k] if actions else None,
                      "reward": round(float(rewards[k]), 6) if k < len(rewards) else None})
    success = bool(traj.metrics.get("success", 0.0))
    return {"trajectory_id": traj.trajectory_id, "item_id": traj.item_id, "env": traj.env,
            "level": label or traj.env, "policy": policy, "horizon": traj.horizon,
            "ended": ended(traj.termination.value, success), "termination": traj.termination.value,
            "success": success,
            "reward": round(traj.total_reward, 6), "num_turns": traj.num_turns, **(extra or {}), "turns": turns}


def as_text(record: dict, max_chars: int = 300, head_turns: int = 3, tail_turns: int = 2) -> str:
    """A record (from `episode_record`) as a few plain lines: its first `head_turns` and last `tail_turns` turns,
    every text cut to `max_chars`, the turns between counted."""
    turns = record["turns"]
    shown = list(enumerate(turns))
    if len(turns) > head_turns + tail_turns:
        shown = shown[:head_turns] + [(-1, None)] + shown[len(turns) - tail_turns:]
    lines = [f"{record['item_id']} ({record['level']}, {record['policy']}, turn limit {record['horizon']})"]
    for k, turn in shown:
        if turn is None:
            lines.append(f"... {len(turns) - head_turns - tail_turns} turns not shown ...")
            continue
        obs = clip_text(turn["observation"], max_chars).replace("\n", " | ")
        reply = clip_text(turn["reply"], max_chars).replace("\n", " | ")
        action = turn["action"]
        parsed = "not recorded" if action is None else (repr(action) if action else "none found")
        lines += [f"[{k + 1}] observation: {obs}", f"    reply: {reply!r}",
                  f"    action: {parsed}, reward {turn['reward']:g}"]
    lines.append(f"ended: {record['ended']} after {record['num_turns']} turn{'s' if record['num_turns'] != 1 else ''}"
                 f", reward {record['reward']:g}")
    return "\n".join(lines)
