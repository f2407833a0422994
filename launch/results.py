"""`python -m launch.results default`: the default run, trained and evaluated, written to docs/results/.

One command regenerates what docs/results/ shows of the default run:
1. it trains the default config (`--config`, README command 1's run) into `--runs`, timing it; at its end the
   run evaluates its final policy greedily on unseen items of its training levels (`eval.item_set=unseen`,
   30 per level unless `--eval-limit`) at its last training horizon and, on the same items, at the reference's
   turn limit (`--long-turns`, 20: `eval.long_max_turns`), each with the random policy and the untrained model
   (the run evaluates its base weights at both limits before its first step);
2. a kept run (`--reuse`) that made no evaluation at `--long-turns` has its checkpoint evaluated there by
   `python -m launch.eval`, with the same baselines;
3. it writes `--out`/default.md (the setup, the CPU, the run's time, both evaluations per level with 95%
   intervals, and the default's bar read line by line: a lead over random of `--margin` at its last horizon; at
   the long limit no worse than random overall, no level more than 0.05 below it, and more successes than at
   the last horizon) and copies the run's curve to `--out`/training.png.
`--reuse` keeps a run already finished in `--runs` (its end evaluation written) and only evaluates and reports.
`--untrained-from RUN` takes the untrained model's rows from another run of the same config (another seed,
say) instead of evaluating the base model again: greedy, on the same items at the same limits, the training
seed does not enter them. The run reuses them only when they were measured on its items at its limits
(launch/job/session.py); otherwise it measures its own.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from configs.load import load_config
from core.checkpoint import write_text_durably
from core.cpu_features import describe_cpu
from core.horizon import HorizonSchedule
from core.metrics import read_jsonl
from launch.eval.report import decoding

ROWS = (("model", "trained policy"), ("untrained", "untrained model"), ("random", "random policy"))


def _run(cmd: list[str], log: Path) -> float:
    started = time.monotonic()
    with open(log, "ab") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    if code != 0:
        raise RuntimeError(f"`{' '.join(cmd[1:4])} ...` exited {code}; its output is in {log}")
    return (time.monotonic() - started) / 60


def _cell(row: dict | None) -> str:
    if not row or not row.get("episodes"):
        return "n/a"
    lo, hi = row["success_rate_ci"]
    return f"{row['success_rate']:.3f} [{lo:.2f}, {hi:.2f}]"


def eval_table(report: dict) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Markdown rows (policy x overall and per level) of one eval_report.json, and the success rates by
    policy and level ('all' overall)."""
    rows = {name: report["rows"].get(name) or [] for name, _ in ROWS}
    model = rows["model"][0]
    levels = sorted(model.get("breakdown", {}))
    lines = ["| policy | overall | " + " | ".join(levels) + " |", "|---|---|" + "---|" * len(levels)]
    rates: dict[str, dict[str, float]] = {}
    for name, label in ROWS:
        if not rows[name]:
            continue
        family = rows[name][0]
        breakdown = family.get("breakdown", {})
        lines.append(f"| {label} | {_cell(family)} | " + " | ".join(_cell(breakdown.get(lv)) for lv in levels) + " |")
        rates[name] = {"all": family.get("success_rate", 0.0),
                       **{lv: breakdown[lv]["success_rate"] for lv in levels if lv in breakdown}}
    return lines, rates


def verdict(short: dict[str, dict[str, float]], long: dict[str, dict[str, float]], margin: float,
            level_slack: float = 0.05) -> list[str]:
    """The default's bar, line by line: at its last horizon the policy beats random by `margin` overall; at the
    long limit it is no worse than random overall, no level falls more than `level_slack` below random, and it
    succeeds more than at its last horizon (it uses the extra turns)."""
    if "random" not in short or "random" not in long:
        return ["No random-policy row to compare against (eval.baselines=false)."]
    model, rand = short["model"]["all"], short["random"]["all"]
    gap = model - rand
    long_model, long_rand = long["model"]["all"], long["random"]["all"]
    long_gap = long_model - long_rand
    below = [f"{lv} ({long['model'][lv]:.3f} vs {long['random'][lv]:.3f})" for lv in sorted(long["model"])
             if lv != "all" and long["model"][lv] < long["random"].get(lv, 0.0) - level_slack - 1e-9]
    return [
        f"At its last training horizon the policy {'beats' if gap >= margin else 'does not beat'} the random policy "
        f"by {margin:g} overall: {model:.3f} vs {rand:.3f} ({gap:+.3f}).",
        f"At the long limit it is {'no worse than' if long_gap >= 0 else 'worse than'} random overall: "
        f"{long_model:.3f} vs {long_rand:.3f} ({long_gap:+.3f}).",
        f"No level is more than {level_slack:g} below random at the long limit." if not below else
        f"More than {level_slack:g} below random at the long limit: {', '.join(below)}.",
        f"It {'uses' if long_model > model else 'does not use'} the extra turns: {long_model:.3f} at the long limit "
        f"against {model:.3f} at its last horizon.",
    ]


def reuse_untrained(source: Path, run: Path, folders: list[str]) -> None:
    """Copy `source`'s untrained.json of each end-evaluation folder into `run`, where the run checks what they
    were measured on before it uses them. Written whole or not at all (write_text_durably); a file that is not
    a run's untrained rows is refused by name."""
    for folder in folders:
        saved = source / folder / "untrained.json"
        if not saved.is_file():
            raise FileNotFoundError(f"--untrained-from: {saved} does not exist (a run of the same config "
                                    "with eval.baselines=true and eval.long_max_turns set holds one per "
                                    "folder)")
        text = saved.read_text()
        try:
            held = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--untrained-from: {saved} is not JSON ({exc})") from None
        if not (isinstance(held, dict) and {"rows", "measured_on"} <= held.keys()):
            raise ValueError(f"--untrained-from: {saved} holds no untrained rows (keys rows and measured_on)")
        (run / folder).mkdir(parents=True, exist_ok=True)
        write_text_durably(run / folder / "untrained.json", text)


def used_untrained_from(source: Path, run: Path, folders: list[str]) -> bool:
    """Whether every folder of `run` still holds `source`'s untrained rows, byte for byte: the run used them
    (a run that found them measured on other items or limits wrote its own)."""
    def rows(root: Path, folder: str) -> bytes | None:
        path = root / folder / "untrained.json"
        return path.read_bytes() if path.is_file() else None

    return all((kept := rows(run, f)) is not None and kept == rows(source, f) for f in folders)


def default(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.results default", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--runs", default="", help="the run's folder (default outputs/results-default-s<trainer.seed>)")
    p.add_argument("--out", default="", help="where default.md and training.png go (default "
                                             "docs/results/default-s<trainer.seed>)")
    p.add_argument("--long-turns", type=int, default=20, help="the second evaluation's turn limit")
    p.add_argument("--eval-limit", type=int, default=0, help="unseen items to evaluate (eval.limit; 0: 30 per level)")
    p.add_argument("--margin", type=float, default=0.20, help="the lead over random the verdict asks for")
    p.add_argument("--reuse", action="store_true", help="keep a finished run in --runs; only evaluate and report")
    p.add_argument("--untrained-from", default="",
                   help="a run of the same config whose untrained rows to reuse")
    p.add_argument("overrides", nargs="*", help="key=value for the run and both evaluations")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    last = HorizonSchedule.from_config(cfg.algorithm).horizon_at(cfg.trainer.total_steps)
    seed = cfg.trainer.seed
    run = Path(args.runs or f"outputs/results-default-s{seed}")
    out = Path(args.out or f"docs/results/default-s{seed}")
    run.mkdir(parents=True, exist_ok=True)
    common = ["eval.item_set=unseen", f"eval.limit={args.eval_limit}", "eval.baselines=true"]
    folders = ["eval", f"eval-{args.long_turns}-turns"]  # the run's end evaluations (eval.long_max_turns)
    short_report = run / folders[0] / "eval_report.json"
    minutes_file = run / "train_minutes.json"
    if args.reuse and short_report.exists() and minutes_file.exists():
        print(f"reusing the finished run in {run}", flush=True)
    else:
        shutil.rmtree(run / "checkpoints", ignore_errors=True)  # a fresh run: no resume from an older one
        if args.untrained_from:
            reuse_untrained(Path(args.untrained_from), run, folders)
        print(f"[{time.strftime('%H:%M:%S')}] training {args.config} into {run} (log {run / 'train.log'})", flush=True)
        cmd = [sys.executable, "-m", "launch.train", "--config", args.config, *args.overrides,
               f"trainer.output_dir={run}", "eval.at_end=true", f"eval.max_turns={last}",
               f"eval.long_max_turns={args.long_turns}", *common, "logging.progress_bar=false"]
        minutes_file.write_text(json.dumps({"minutes": _run(cmd, run / "train.log")}))  # read back below
    minutes = json.loads(minutes_file.read_text())["minutes"]
    long_dir = run / folders[1]
    if not (long_dir / "eval_report.json").exists():  # a kept run that made none: evaluate its checkpoint
        print(f"[{time.strftime('%H:%M:%S')}] evaluating at {args.long_turns} turns into {long_dir}", flush=True)
        _run([sys.executable, "-m", "launch.eval", "--env", "babyai", "--config", args.config,
              "--model", str(run / "checkpoints"), "--out", str(long_dir), *args.overrides, *common,
              f"eval.max_turns={args.long_turns}"], run / "eval.log")
    short_lines, short = eval_table(json.loads(short_report.read_text()))
    long_report = json.loads((long_dir / "eval_report.json").read_text())
    long_lines, long = eval_table(long_report)
    steps = [r for r in read_jsonl(run / "metrics.jsonl") if "rollout/horizon" in r]
    step_s = sum(r.get("perf/step_seconds", 0.0) for r in steps)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run / "training.png", out / "training.png")
    borrowed = bool(args.untrained_from) and used_untrained_from(Path(args.untrained_from), run, folders)
    command = " ".join(["python -m launch.results default", *argv])
    items = long_report.get("items", "unseen items of the training levels")
    text = [
        "# The default run: its curve and its evaluation against baselines", "",
        f"Produced by `{command}` on {date.today().isoformat()} ({os.cpu_count()} cores, {describe_cpu()}): "
        f"`{args.config}`"
        + (f" with {' '.join(f'`{o}`' for o in args.overrides)}" if args.overrides else "")
        + f": {len(steps)} steps, {step_s / 60:.1f} min of training steps, {minutes:.1f} min for the whole run "
        + ("(start-up and the final evaluations included; the untrained model's rows were taken from "
           "another run)." if borrowed else "(start-up, the untrained model's evaluations before the first "
           "step and the final ones included)."), "",
        "![reward, success rate and valid-action fraction per step](training.png)", "",
        f"Evaluation of the final checkpoint ({decoding(long_report)}) on {items}, beside the untrained "
        "model and a policy that picks "
        "a uniformly random available action, on the same items. Success rate [95% Wilson interval]."
        + (f" The untrained model's rows are those measured by the run in `{args.untrained_from}` (greedy, "
           "the same items and limits; the training seed does not enter them)." if borrowed else ""), "",
        f"## At the last training horizon ({last} turns)", "", *short_lines, "",
        f"## At the reference's turn limit ({args.long_turns} turns)", "", *long_lines, "",
        "## Reading", "", *[f"- {line}" for line in verdict(short, long, args.margin)],
    ]
    (out / "default.md").write_text("\n".join(text) + "\n")
    print(f"report: {out / 'default.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "default":
        print("usage: python -m launch.results default [options] [key=value ...]", file=sys.stderr)
        return 2
    return default(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
