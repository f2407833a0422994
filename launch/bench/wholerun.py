"""The async bench's headline: each run's whole wall clock, async over sync per seed, and the bounds it must obey.

A run's wall clock runs from its first admitted episode (the earliest `time` in groups.jsonl, written when a
group starts) to its last trained step (the last `time` in trained.jsonl, written when a step's batch has been
trained and published). Step 1, which fills the pipeline and warms the engine, and the drain, the last steps an
async run trains after its last group started, are inside it: a user waits for them too.

Bounds, per seed, from the same runs: no async run can take less wall time than

- its generator was busy (generation bound): the largest replica's busy seconds, the sum over steps of
  `perf/generator<i>/busy_frac` times the step's seconds (the generator reports its busy share of the time since
  the step before; a run logging stats less often than every step has no such bound here);
- its learner trained (learner bound): the sum over every step of `perf/train_seconds + perf/publish_seconds`;
- its critical path: the learner's wait for its first batch, then every step's training and publishing in turn.

So sync_wall / bound is the most async over sync can be on that seed; a ratio above one of them means the
bench measured something wrong (clocks, files of another run), and it is printed flagged as a bench bug.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from core.metrics import read_jsonl

SLACK = 1.01  # the timestamps and the coordinator's step clock are read at slightly different moments


def wall_clock(groups: list[dict], trained: list[dict]) -> tuple[float, float]:
    """(first admitted episode, last trained step) as Unix times, from the lineage's rows."""
    starts = [g["time"] for g in groups if "time" in g]
    ends = [t["time"] for t in trained if "time" in t]
    if not starts or not ends or len(starts) != len(groups) or len(ends) != len(trained):
        raise ValueError("the run's groups.jsonl and trained.jsonl must carry a `time` on every row (runs made "
                         "before the lineage had it cannot give a whole-run figure)")
    return min(starts), max(ends)


def learner_seconds(rows: list[dict]) -> float:
    return sum(r.get("perf/train_seconds", 0.0) + r.get("perf/publish_seconds", 0.0) for r in rows)


def generator_busy_seconds(rows: list[dict]) -> float:
    """The busiest replica's busy seconds over the run (0 when no step carried the replicas' busy_frac)."""
    busy: dict[str, float] = {}
    for r in rows:
        for key, value in r.items():
            if key.startswith("perf/generator") and key.endswith("/busy_frac"):
                busy[key] = busy.get(key, 0.0) + value * r.get("perf/step_seconds", 0.0)
    return max(busy.values(), default=0.0)


def record(rows: list[dict], groups: list[dict], trained: list[dict]) -> dict:
    """One run's whole-run figures."""
    start, end = wall_clock(groups, trained)
    first_wait = rows[0].get("perf/learner_idle_frac", 0.0) * rows[0].get("perf/step_seconds", 0.0)
    learner = learner_seconds(rows)
    return {"wall_s": end - start, "steps": len(rows), "learner_s": learner, "gen_busy_s": generator_busy_seconds(rows),
            "critical_s": first_wait + learner, "tokens": sum(r.get("train/batch_tokens", 0.0) for r in rows),
            "step1_s": rows[0].get("perf/step_seconds", 0.0)}


def read_run(run_dir: Path) -> dict:
    return record(read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "groups.jsonl"),
                  read_jsonl(run_dir / "trained.jsonl"))


def seed_figures(sync: dict, run_async: dict) -> dict:
    """async over sync on one seed, with the bounds of that seed's async run and whether it passed one."""
    out = {"ratio": sync["wall_s"] / run_async["wall_s"], "sync_wall_s": sync["wall_s"],
           "async_wall_s": run_async["wall_s"]}
    for name, key in (("generation", "gen_busy_s"), ("learner", "learner_s"), ("critical_path", "critical_s")):
        out[f"{name}_bound"] = sync["wall_s"] / run_async[key] if run_async[key] > 0 else float("inf")
    out["above_bound"] = [n for n in ("generation", "learner", "critical_path")
                          if out["ratio"] > out[f"{n}_bound"] * SLACK]
    return out


def headline(per_seed: dict[int, dict], name: str) -> tuple[dict, list[str]]:
    """The median over seeds and the spread, as figures and printed lines (every seed's run on its own line)."""
    lines, figures = [], {}
    for seed, f in per_seed.items():
        flag = ("  BENCH BUG: above the " + ", ".join(f["above_bound"]) + " bound") if f["above_bound"] else ""
        lines.append(f"seed {seed}: sync {f['sync_wall_s']:.1f} s, async {f['async_wall_s']:.1f} s whole run -> "
                     f"{f['ratio']:.3f} (bounds: generation {f['generation_bound']:.3f}, learner "
                     f"{f['learner_bound']:.3f}, critical path {f['critical_path_bound']:.3f}){flag}")
        figures[f"{name}_seed{seed}"] = f["ratio"]
        for bound in ("generation", "learner", "critical_path"):
            figures[f"{name}_seed{seed}_{bound}_bound"] = f[f"{bound}_bound"]
    ratios = [f["ratio"] for f in per_seed.values()]
    figures[name] = statistics.median(ratios)
    figures[f"{name}_min"], figures[f"{name}_max"] = min(ratios), max(ratios)
    figures[f"{name}_bench_bug"] = any(f["above_bound"] for f in per_seed.values())
    lines.append(f"{name} = {figures[name]:.3f} (median of {len(ratios)} seeds; spread {min(ratios):.3f} to "
                 f"{max(ratios):.3f}; from each run's first admitted episode to its last trained step, step 1 "
                 "and the drain included)")
    return figures, lines
