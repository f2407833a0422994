"""What the ablations (`python -m launch.ablate horizon|offpolicy`) share: every run is a `launch.train` of its
own (its output in `--runs/<variant>-s<seed>`: train.log, metrics.jsonl, episodes.jsonl, its final evaluation
greedy on unseen items of its training levels); `--seeds` sets trainer.seed, generator.seed and learner.seed
together; the first run also evaluates the random policy and the untrained model on those items; `--eval-every N`
keeps a checkpoint every N steps and evaluates each on the same items after the run (success on unseen items
against learner steps and against wall-clock); `--reuse` keeps the runs (and evaluations) already finished, so an
interrupted ablation resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from core.metrics import read_jsonl


def common_arguments(p: argparse.ArgumentParser, runs: str, report: str, seeds: list[int]) -> None:
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=seeds,
                   help="each sets trainer.seed, generator.seed and learner.seed")
    p.add_argument("--eval-limit", type=int, default=0, help="unseen items to evaluate (eval.limit; 0: 30 per level)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="also evaluate a checkpoint every N steps on the same items, after each run (0: the final "
                        "policy only)")
    p.add_argument("--runs", default=runs, help="where each run's folder goes")
    p.add_argument("--report", default=report)
    p.add_argument("--reuse", action="store_true",
                   help="keep every run already finished in --runs (its final evaluation written) instead of "
                        "training it again: an interrupted ablation resumes where it stopped")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each --eval-every checkpoint after its evaluation (by default it is removed once "
                        "evaluated, the run's last one kept: a checkpoint of the default is 2.6 GB)")
    p.add_argument("overrides", nargs="*", help="key=value for every run (e.g. env.babyai.levels=[...])")


def seed_overrides(seed: int) -> list[str]:
    return [f"trainer.seed={seed}", f"generator.seed={seed}", f"learner.seed={seed}"]


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def trained_turns(run_dir: Path) -> float:
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    totals = [r["rollout/trained_turns_total"] for r in rows if "rollout/trained_turns_total" in r]
    if not totals:
        raise RuntimeError(f"{run_dir}/metrics.jsonl holds no trained turns: the run trained no step")
    return totals[-1]


TRAINED_IN = re.compile(r"trained \d+ steps in ([0-9.]+) min")


def run_minutes(run_dir: Path) -> tuple[float, float]:
    """(training, evaluation) minutes of one run, from what the run wrote itself: its log's closing line
    (`trained N steps in X min`) and each evaluation's report (the final one and every curve/step_N); the start-up
    of each process is left out. (0, 0) parts where the run left none."""
    log = run_dir / "train.log"
    found = TRAINED_IN.findall(log.read_text(errors="replace")) if log.exists() else []
    train = float(found[-1]) if found else 0.0
    reports = [run_dir / "eval" / "eval_report.json", *sorted((run_dir / "curve").glob("step_*/eval_report.json"))]
    evals = sum(float(json.loads(p.read_text()).get("minutes", 0.0)) for p in reports if p.exists())
    return train, evals


def invocation_line(minutes: float) -> str:
    """How long the command that wrote a report ran; "under a minute" rather than `0 min` (a --reuse invocation
    that only reads its runs back), which the header's run minutes beside it would seem to contradict."""
    return f"this invocation {minutes:.0f} min" if minutes >= 0.5 else "this invocation under a minute"


def budget_line(runs: dict[str, dict[int, Path]]) -> str:
    """What the ablation's runs took, in their own figures (a report's header; true whether or not --reuse)."""
    parts = [run_minutes(d) for by_seed in runs.values() for d in by_seed.values()]
    train, evals = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return (f"{len(parts)} runs: {train:.0f} min of training and {evals:.0f} min of evaluation in all (each run's "
            "own log and reports; process start-ups left out)")


def eval_overrides(args: argparse.Namespace, eval_turns: int) -> list[str]:
    """What every evaluation of the ablation shares: greedy, unseen items of the training levels, one turn limit."""
    return ["eval.item_set=unseen", f"eval.limit={args.eval_limit}", f"eval.max_turns={eval_turns}",
            "eval.long_max_turns=0", "logging.progress_bar=false"]  # one limit: the default's second is not theirs


def _run(cmd: list[str], log_path: Path, what: str) -> None:
    with open(log_path, "ab") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    if code != 0:
        raise RuntimeError(f"{what}: exited {code}; its output is in {log_path}")


def train(name: str, overrides: list[str], args: argparse.Namespace, first: bool, eval_turns: int) -> Path:
    """Train one variant (and evaluate it at its end, on unseen items at `eval_turns`), unless --reuse finds it
    finished; then evaluate its kept checkpoints (--eval-every)."""
    run_dir = Path(args.runs) / name
    if args.reuse and (run_dir / "eval" / "eval_report.json").exists():
        _say(f"{name}: reusing the finished run in {run_dir} ({trained_turns(run_dir):.0f} trained turns)")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        every = args.eval_every
        checkpoints = [f"checkpoint.every_steps={every}", "checkpoint.keep_last=1000"] if every else \
            ["checkpoint.every_steps=0"]
        cmd = [sys.executable, "-m", "launch.train", "--config", args.config, f"trainer.output_dir={run_dir}",
               "eval.at_end=true", f"eval.baselines={str(first).lower()}", *checkpoints,
               *eval_overrides(args, eval_turns), *args.overrides, *overrides]
        started = time.monotonic()
        _say(f"{name}: training ({' '.join(overrides)})")
        _run(cmd, run_dir / "train.log", f"{name}: the run")
        _say(f"{name}: done in {(time.monotonic() - started) / 60:.1f} min, {trained_turns(run_dir):.0f} trained turns")
    if args.eval_every:
        evaluate_checkpoints(name, run_dir, args, eval_turns)
    return run_dir


def evaluate_checkpoints(name: str, run_dir: Path, args: argparse.Namespace, eval_turns: int) -> None:
    """Evaluate every kept checkpoint before the last step (the run's own final evaluation covers that one) into
    `<run>/curve/step_N/`, skipping those already evaluated; then remove it, unless --keep-checkpoints."""
    import shutil

    from core.checkpoint import CheckpointStore

    last = max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)
    for path in CheckpointStore(run_dir / "checkpoints").complete():
        step = int(path.name.split("_")[1].split(".")[0])
        if step >= last:
            continue
        out = run_dir / "curve" / f"step_{step:08d}"
        if not (out / "eval_report.json").exists():
            _say(f"{name}: evaluating its checkpoint of step {step}")
            cmd = [sys.executable, "-m", "launch.eval", "--config", args.config, "--model", str(path),
                   "--out", str(out), *args.overrides, "eval.baselines=false", *eval_overrides(args, eval_turns)]
            out.mkdir(parents=True, exist_ok=True)
            _run(cmd, out / "eval.log", f"{name}: the evaluation of step {step}")
        if not args.keep_checkpoints:
            shutil.rmtree(path)  # evaluated: its report is what the ablation needs

