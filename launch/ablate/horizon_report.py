"""The horizon ablation's report (launch/ablate/horizon.py): a Markdown page and a PNG beside it, from each run's
metrics.jsonl and eval reports; and what the off-policy report (launch/ablate/offpolicy_report.py) shares with it.
Every figure on the page is read from those files."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from core.metrics import read_jsonl
from launch.ablate.runs import budget_line, invocation_line

LABELS = {"scaling": "ScalingInter-RL", "fixed_short": "fixed short", "fixed_long": "fixed long"}
COLORS = {"scaling": "tab:green", "fixed_short": "tab:blue", "fixed_long": "tab:red"}
STEP_KEY, TURNS_KEY = "step", "rollout/trained_turns_total"


def final_eval(run_dir: Path) -> dict:
    report = json.loads((run_dir / "eval" / "eval_report.json").read_text())
    rows = report["rows"]
    out = {"items": report.get("items", ""), "model": rows["model"][0]}
    for baseline in ("random", "untrained"):
        if rows.get(baseline):
            out[baseline] = rows[baseline][0]
    return out


def step_rows(run_dir: Path) -> list[dict]:
    """The run's per-step metrics (the lines that record a trained step)."""
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if TURNS_KEY in r]


def unseen_curve(run_dir: Path) -> list[tuple[int, float, dict]]:
    """(learner step, training seconds up to it, the model's eval row) per evaluated checkpoint, the final
    evaluation last. Seconds: the sum of the steps' perf/step_seconds (waiting, training and publishing; start-up
    and evaluations excluded)."""
    rows = step_rows(run_dir)
    elapsed, total = {}, 0.0
    for r in rows:
        total += r.get("perf/step_seconds", 0.0)
        elapsed[r[STEP_KEY]] = total
    points = []
    for report in sorted((run_dir / "curve").glob("step_*/eval_report.json")):
        step = int(report.parent.name.split("_")[1])
        points.append((step, elapsed.get(step, 0.0), json.loads(report.read_text())["rows"]["model"][0]))
    if rows:
        points.append((rows[-1][STEP_KEY], total, final_eval(run_dir)["model"]))
    return points


def fmt(row: dict) -> str:
    lo, hi = row["success_rate_ci"]
    n = row["episodes"]
    return f"{row['success_rate']:.3f} [{lo:.2f}, {hi:.2f}] ({n} episode{'s' if n != 1 else ''})"


def spread(rates: list[float]) -> tuple[float, tuple[float, float]]:
    return sum(rates) / len(rates), (min(rates), max(rates))


def compare(label_a: str, label_b: str, means: dict, ranges: dict, a: str, b: str,
            n_seeds: int) -> tuple[str, bool]:
    """One line comparing variant a to b (mean difference, whether the seeds' ranges overlap), and whether a's
    every seed lies above b's (never with one seed: there is no spread to be beyond)."""
    if n_seeds < 2:
        return f"{label_a} minus {label_b}: {means[a] - means[b]:+.3f} (one seed: no spread to weigh it by).", False
    above = ranges[a][0] > ranges[b][1]
    apart = above or ranges[a][1] < ranges[b][0]
    return (f"{label_a} minus {label_b}: {means[a] - means[b]:+.3f}; the seeds' ranges "
            f"{'do not overlap' if apart else 'overlap'}."), above


def plot(runs: dict[str, dict[int, Path]], out_png: Path) -> None:
    """Success rate of the trained batches and turns per episode, against learner steps (left) and trained
    turns (right); with checkpoint evaluations, the success on unseen items too (a third row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = any((d / "curve").is_dir() for by_seed in runs.values() for d in by_seed.values())
    rows = [("rollout/success_rate", "success rate of the trained batch"), ("rollout/turns_mean", "turns per episode")]
    fig, axes = plt.subplots(len(rows) + curves, 2, figsize=(11, 3.6 * (len(rows) + curves)), dpi=110, squeeze=False)
    for variant, by_seed in runs.items():
        for i, (seed, run_dir) in enumerate(sorted(by_seed.items())):
            metrics = step_rows(run_dir)
            label = LABELS[variant] if i == 0 else None
            for col, xkey in enumerate((STEP_KEY, TURNS_KEY)):
                for row, (key, _) in enumerate(rows):
                    axes[row][col].plot([r[xkey] for r in metrics], [r.get(key, 0.0) for r in metrics],
                                        color=COLORS[variant], alpha=0.8, linewidth=1.2, marker="o", markersize=2,
                                        label=label)
            if curves:
                points = unseen_curve(run_dir)
                turns_at = {r[STEP_KEY]: r[TURNS_KEY] for r in metrics}
                for col, xs in enumerate(([s for s, _, _ in points], [turns_at.get(s, 0.0) for s, _, _ in points])):
                    axes[-1][col].plot(xs, [p["success_rate"] for _, _, p in points], color=COLORS[variant],
                                       marker="s", markersize=3, linewidth=1.2, alpha=0.8)
    titles = [t for _, t in rows] + (["success on unseen items (greedy)"] if curves else [])
    for row, title in enumerate(titles):
        for col, xlabel in enumerate(("learner steps", "trained turns (all batches so far)")):
            ax = axes[row][col]
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
    axes[0][0].legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)


def reading(means: dict[str, float], ranges: dict[str, tuple[float, float]], n_seeds: int) -> list[str]:
    order = sorted(means, key=means.get, reverse=True)
    text = f"{LABELS[order[0]]} ({means[order[0]]:.3f})"
    for before, v in zip(order, order[1:]):
        text += f" {'=' if means[v] == means[before] else '>'} {LABELS[v]} ({means[v]:.3f})"
    lines = [f"Ordering of the mean final success rate: {text}."]
    widest = max(hi - lo for lo, hi in ranges.values())
    for other in ("fixed_short", "fixed_long"):
        line, _ = compare("ScalingInter-RL", LABELS[other], means, ranges, "scaling", other, n_seeds)
        lines.append(line[:-1] + f" (largest seed-to-seed range {widest:.3f})." if n_seeds > 1 else line)
    holds = means["scaling"] > max(means["fixed_short"], means["fixed_long"])
    separated = n_seeds > 1 and all((ranges["scaling"][0] > ranges[o][1]) for o in ("fixed_short", "fixed_long"))
    verdict = ("holds, with every seed of ScalingInter-RL above every seed of both fixed horizons" if separated else
               "holds on its one seed" if holds and n_seeds < 2 else
               "holds in the means, but not beyond the seed-to-seed spread" if holds else "does not hold here")
    lines.append(f"The paper's ordering (ScalingInter-RL above both fixed horizons) {verdict}"
                 + (f", over {n_seeds} seeds." if n_seeds > 1 else "."))
    if n_seeds < 2:
        lines.append("With one seed there is no seed-to-seed spread to compare against: this is a single draw.")
    return lines


def write_report(path: Path, runs: dict[str, dict[int, Path]], args: argparse.Namespace, command: str,
                 minutes: float, today: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_suffix(".png")
    plot(runs, png)
    evals = {v: {s: final_eval(d) for s, d in by_seed.items()} for v, by_seed in runs.items()}
    metrics = {v: {s: step_rows(d) for s, d in by_seed.items()} for v, by_seed in runs.items()}
    if args.equal == "steps":
        title, how = "equal learner steps", (f"every variant trains {args.steps} learner step{'s' if args.steps != 1 else ''} "
                                        "(the paper's x-axis)")
    else:
        title, how = "equal sampled turns", ("each fixed run trains until its batches held as many turns as the "
                                             "ScalingInter-RL run of its seed")
    lines = [
        f"# Horizon ablation: fixed short, fixed long and ScalingInter-RL at {title}", "",
        f"Produced by `{command}` on {today} ({os.cpu_count()} cores; {budget_line(runs)}; "
        f"{invocation_line(minutes)}).", "",
        f"Setup: `{args.config}`{' with ' + ' '.join(f'`{o}`' for o in args.overrides) if args.overrides else ''}; "
        f"short {args.short} turns, long {args.long}, ScalingInter-RL in {args.stages} stages over {args.steps} "
        f"steps; {how}. Seeds {', '.join(map(str, args.seeds))}. Final evaluation: greedy, at {args.long} turns, on "
        f"{next(iter(next(iter(evals.values())).values()))['items']}.", "",
        "## Final evaluation", "",
        "| variant | seed | steps | trained turns | success rate [95% interval] |", "|---|---|---|---|---|"]
    means, ranges = {}, {}
    for variant, by_seed in evals.items():
        for seed, ev in sorted(by_seed.items()):
            rows = metrics[variant][seed]
            lines.append(f"| {LABELS[variant]} | {seed} | {rows[-1]['step']} | {rows[-1][TURNS_KEY]:.0f} | "
                         f"{fmt(ev['model'])} |")
        means[variant], ranges[variant] = spread([ev["model"]["success_rate"] for ev in by_seed.values()])
    lines += ["", "| variant | mean over seeds | seed range |", "|---|---|---|"]
    lines += [f"| {LABELS[v]} | {means[v]:.3f} | {ranges[v][0]:.3f}–{ranges[v][1]:.3f} |" for v in means]
    base = next((ev for by_seed in evals.values() for ev in by_seed.values() if "random" in ev), None)
    if base is not None:
        lines += ["", "Baselines on the same items: random policy " + fmt(base["random"])
                  + ("; untrained model " + fmt(base["untrained"]) if "untrained" in base else "") + "."]
    other = "trained turns" if args.equal == "steps" else "learner steps"
    lines += ["", "## Curves", "", f"![curves against learner steps and against trained turns]({png.name})", "",
              f"Left: against learner steps; right: against trained turns. The runs were made equal in "
              f"{'learner steps' if args.equal == 'steps' else 'trained turns'}; the {other} view beside it shows "
              f"the same runs on the other axis (their ends differ there).", "", "## Reading", ""]
    lines += [f"- {line}" for line in reading(means, ranges, len(args.seeds))]
    path.write_text("\n".join(lines) + "\n")
