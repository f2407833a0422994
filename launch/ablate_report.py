"""The horizon ablation's report (launch/ablate.py): a Markdown page and a PNG beside it, from each run's
metrics.jsonl and eval/eval_report.json. Every figure on the page is read from those files."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from core.metrics import read_jsonl

LABELS = {"scaling": "ScalingInter-RL", "fixed_short": "fixed short", "fixed_long": "fixed long"}
COLORS = {"scaling": "tab:green", "fixed_short": "tab:blue", "fixed_long": "tab:red"}


def final_eval(run_dir: Path) -> dict:
    report = json.loads((run_dir / "eval" / "eval_report.json").read_text())
    rows = report["rows"]
    out = {"items": report.get("items", ""), "model": rows["model"][0]}
    for baseline in ("random", "untrained"):
        if rows.get(baseline):
            out[baseline] = rows[baseline][0]
    return out


def _fmt(row: dict) -> str:
    lo, hi = row["success_rate_ci"]
    n = row["episodes"]
    return f"{row['success_rate']:.3f} [{lo:.2f}, {hi:.2f}] ({n} episode{'s' if n != 1 else ''})"


def plot(runs: dict[str, dict[int, Path]], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for variant, by_seed in runs.items():
        for i, (seed, run_dir) in enumerate(sorted(by_seed.items())):
            rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "rollout/trained_turns_total" in r]
            x = [r["rollout/trained_turns_total"] for r in rows]
            for ax, key in zip(axes, ("rollout/success_rate", "rollout/turns_mean")):
                ax.plot(x, [r.get(key, 0.0) for r in rows], color=COLORS[variant], alpha=0.8, linewidth=1.2,
                        marker="o", markersize=2, label=LABELS[variant] if i == 0 else None)
    for ax, title in zip(axes, ("success rate of the trained batch", "turns per episode")):
        ax.set_xlabel("trained turns (all batches so far)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)


def reading(means: dict[str, float], ranges: dict[str, tuple[float, float]], n_seeds: int) -> list[str]:
    order = sorted(means, key=means.get, reverse=True)
    text = f"{LABELS[order[0]]} ({means[order[0]]:.3f})"
    for before, v in zip(order, order[1:]):
        text += f" {'=' if means[v] == means[before] else '>'} {LABELS[v]} ({means[v]:.3f})"
    lines = [f"Ordering of the mean final success rate: {text}."]
    spread = max(hi - lo for lo, hi in ranges.values())
    for other in ("fixed_short", "fixed_long"):
        diff = means["scaling"] - means[other]
        apart = (ranges["scaling"][0] > ranges[other][1]) or (ranges["scaling"][1] < ranges[other][0])
        lines.append(f"ScalingInter-RL minus {LABELS[other]}: {diff:+.3f}; the seeds' ranges "
                     f"{'do not overlap' if apart else 'overlap'} (largest seed-to-seed range {spread:.3f}).")
    holds = means["scaling"] > max(means["fixed_short"], means["fixed_long"])
    separated = all((ranges["scaling"][0] > ranges[o][1]) for o in ("fixed_short", "fixed_long"))
    verdict = ("holds, with every seed of ScalingInter-RL above every seed of both fixed horizons" if separated else
               "holds in the means, but not beyond the seed-to-seed spread" if holds else "does not hold here")
    lines.append(f"The paper's ordering (ScalingInter-RL above both fixed horizons) {verdict}, over {n_seeds} "
                 f"seed{'s' if n_seeds != 1 else ''}.")
    if n_seeds < 2:
        lines.append("With one seed there is no seed-to-seed spread to compare against: this is a single draw.")
    return lines


def write_report(path: Path, runs: dict[str, dict[int, Path]], args: argparse.Namespace, command: str,
                 minutes: float, today: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_suffix(".png")
    plot(runs, png)
    evals = {v: {s: final_eval(d) for s, d in by_seed.items()} for v, by_seed in runs.items()}
    turns = {v: {s: read_jsonl(d / "metrics.jsonl") for s, d in by_seed.items()} for v, by_seed in runs.items()}
    lines = [
        "# Horizon ablation: fixed short, fixed long and ScalingInter-RL at equal sampled turns", "",
        f"Produced by `{command}` on {today} ({os.cpu_count()} cores, {minutes:.0f} min in all).", "",
        f"Setup: `{args.config}`{' with ' + ' '.join(f'`{o}`' for o in args.overrides) if args.overrides else ''}; "
        f"short {args.short} turns, long {args.long}, ScalingInter-RL in {args.stages} stages over {args.steps} "
        f"steps; each fixed run trains until its batches held as many turns as the ScalingInter-RL run of its "
        f"seed. Seeds {', '.join(map(str, args.seeds))}. Final evaluation: greedy, at {args.long} turns, on "
        f"{next(iter(next(iter(evals.values())).values()))['items']}.", "",
        "## Final evaluation", "",
        "| variant | seed | steps | trained turns | success rate [95% interval] |", "|---|---|---|---|---|"]
    means, ranges = {}, {}
    for variant, by_seed in evals.items():
        rates = []
        for seed, ev in sorted(by_seed.items()):
            rows = [r for r in turns[variant][seed] if "rollout/trained_turns_total" in r]
            lines.append(f"| {LABELS[variant]} | {seed} | {rows[-1]['step']} | "
                         f"{rows[-1]['rollout/trained_turns_total']:.0f} | {_fmt(ev['model'])} |")
            rates.append(ev["model"]["success_rate"])
        means[variant], ranges[variant] = sum(rates) / len(rates), (min(rates), max(rates))
    lines += ["", "| variant | mean over seeds | seed range |", "|---|---|---|"]
    lines += [f"| {LABELS[v]} | {means[v]:.3f} | {ranges[v][0]:.3f}–{ranges[v][1]:.3f} |" for v in means]
    base = next((ev for by_seed in evals.values() for ev in by_seed.values() if "random" in ev), None)
    if base is not None:
        lines += ["", "Baselines on the same items: random policy " + _fmt(base["random"])
                  + ("; untrained model " + _fmt(base["untrained"]) if "untrained" in base else "") + "."]
    lines += ["", "## Curves", "", f"![success rate and episode length against trained turns]({png.name})", "",
              "## Reading", ""]
    lines += [f"- {line}" for line in reading(means, ranges, len(args.seeds))]
    path.write_text("\n".join(lines) + "\n")
