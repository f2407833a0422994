"""`python -m launch.soak_report RUN_DIR`: is a long run flat? Each role's memory and tokens/s after warm-up.

Reads the run's metrics.jsonl, which carries every step each role's resident memory (`perf/rss_mb/<role>`) and
tokens/s (`perf/train_tokens_per_s`, `perf/gen_tokens_per_s`, `perf/generator<i>/tokens_per_s`,
`perf/driver/tokens_per_s`; launch/job/role_stats.py). For each series, after the first `--warmup` steps:

- the reference is the median of the first `--window` steps after warm-up;
- the series is smoothed by a running median over `--window` steps (one step's tokens/s swings with the batch's
  episode lengths; a trend is what a leak or a slowdown shows), and its largest deviation from the reference,
  above and below, is reported as a fraction;
- a series is flat when every smoothed point stays within +-`--band` (15 %) of the reference. The raw per-step
  extremes are printed beside it, so a smoothing that hid something can be seen.

Writes `soak.png` in the run's folder (memory on one panel, tokens/s on the other) and ends with one JSON line:
per series its deviations and `flat`, and `soak_flat` over all of them. Steps missing a series are counted, not
filled in. A run shorter than warm-up plus two windows is refused.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from core.metrics import read_jsonl

RATE_KEYS = ("perf/train_tokens_per_s", "perf/gen_tokens_per_s", "perf/driver/tokens_per_s")


def series_keys(rows: list[dict]) -> list[str]:
    keys = {k for r in rows for k in r if k.startswith("perf/rss_mb/")}
    keys |= {k for r in rows for k in r if k in RATE_KEYS
             or (k.startswith("perf/generator") and k.endswith("/tokens_per_s"))}
    return sorted(keys)


def flatness(values: list[float], window: int, band: float) -> dict:
    """The reference, the running median's largest deviations from it (fractions), the raw extremes, flat."""
    reference = statistics.median(values[:window])
    smooth = [statistics.median(values[i:i + window]) for i in range(len(values) - window + 1)]
    scale = abs(reference) if reference else 1.0
    up, down = max(smooth) / scale - 1.0, min(smooth) / scale - 1.0
    return {"reference": reference, "max_dev": up, "min_dev": down, "raw_max_dev": max(values) / scale - 1.0,
            "raw_min_dev": min(values) / scale - 1.0, "flat": reference > 0 and up <= band and down >= -band,
            "first": smooth[0], "last": smooth[-1]}


def report(rows: list[dict], warmup: int, window: int, band: float) -> dict:
    after = [r for r in rows if r.get("step", 0) > warmup]
    if len(after) < 2 * window:
        raise ValueError(f"{len(rows)} steps leave {len(after)} after a warm-up of {warmup}: need at least "
                         f"{2 * window} (two windows of {window})")
    out: dict = {"steps": len(rows), "warmup": warmup, "window": window, "band": band, "series": {}}
    for key in series_keys(after):
        values = [r[key] for r in after if key in r]
        missing = len(after) - len(values)
        if len(values) < 2 * window:
            out["series"][key] = {"flat": False, "missing_steps": missing, "why": "too few steps carry it"}
            continue
        out["series"][key] = {**flatness(values, window, band), "missing_steps": missing}
    out["soak_flat"] = bool(out["series"]) and all(s["flat"] for s in out["series"].values())
    return out


def plot(rows: list[dict], keys: list[str], warmup: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, rate) = plt.subplots(2, 1, figsize=(9, 7), dpi=110, sharex=True)
    for key in keys:
        ax = mem if key.startswith("perf/rss_mb/") else rate
        points = [(r["step"], r[key] / (1024 if ax is mem else 1)) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker=".", markersize=3, label=key.removeprefix("perf/"))
    for ax, label in ((mem, "resident memory, GB"), (rate, "tokens/s")):
        ax.axvline(warmup + 0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    rate.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.soak_report", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--warmup", type=int, default=10, help="steps left out at the start (caches, allocator arenas)")
    p.add_argument("--window", type=int, default=5, help="steps of the running median and of the reference")
    p.add_argument("--band", type=float, default=0.15, help="the largest deviation from the reference still flat")
    args = p.parse_args(argv)
    rows = read_jsonl(args.run_dir / "metrics.jsonl")
    try:
        found = report(rows, args.warmup, args.window, args.band)
    except ValueError as exc:
        p.error(str(exc))
    print(f"{found['steps']} steps; after {args.warmup} of warm-up, running medians of {args.window} against the "
          f"first window's, flat within +-{args.band:.0%}:")
    for key, s in found["series"].items():
        if "reference" not in s:
            print(f"  {key}: {s['why']} ({s['missing_steps']} steps without it)")
            continue
        print(f"  {key}: {s['reference']:.1f} -> {s['last']:.1f}, smoothed {s['min_dev']:+.1%} / {s['max_dev']:+.1%}"
              f" (raw steps {s['raw_min_dev']:+.1%} / {s['raw_max_dev']:+.1%})"
              + ("" if s["flat"] else "  NOT FLAT") + (f", {s['missing_steps']} steps without it"
                                                         if s["missing_steps"] else ""))
    plot(rows, list(found["series"]), args.warmup, args.run_dir / "soak.png")
    print(f"plot: {args.run_dir / 'soak.png'}")
    print(json.dumps(found, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
