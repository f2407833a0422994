"""The off-policy ablation's report (launch/ablate/offpolicy.py): a Markdown page and a PNG beside it, from each
run's metrics.jsonl and eval reports. Every figure on the page is read from those files."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from launch.ablate.horizon_report import compare, final_eval, fmt, spread, step_rows, unseen_curve
from launch.ablate.runs import budget_line, invocation_line

LABELS = {"decoupled": "decoupled (correction on)", "coupled": "coupled (correction off)", "sync": "eta = 0 (sync)"}
COLORS = {"decoupled": "tab:green", "coupled": "tab:red", "sync": "tab:blue"}
Curves = dict[str, dict[int, list[tuple[int, float, dict]]]]  # variant -> seed -> unseen_curve(run)


def mean_staleness(run_dir: Path) -> tuple[float, float]:
    """(mean, largest) staleness of the trained tokens over the run, in versions, from the learner's histogram
    (`train/staleness/<k>`: the fraction of a step's sampled tokens k versions old; the `8+` bucket counts 8)."""
    total = weight = 0.0
    largest = 0
    for r in step_rows(run_dir):
        tokens = r.get("train/sampled_tokens", 1.0)
        for key, frac in r.items():
            if not key.startswith("train/staleness/") or key.endswith("ahead") or not frac:
                continue
            k = int(key.rsplit("/", 1)[1].rstrip("+"))
            total += k * frac * tokens
            largest = max(largest, k)
        weight += tokens
    return (total / weight if weight else 0.0), float(largest)


def plot(curves: Curves, untrained: dict | None, out_png: Path) -> None:
    """Success on unseen items against learner steps (left) and against the steps' wall-clock (right), each
    seed's 95% interval shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for variant, by_seed in curves.items():
        for i, (_, curve) in enumerate(sorted(by_seed.items())):
            points = ([(0, 0.0, untrained)] if untrained else []) + curve
            for ax, xs in zip(axes, ([s for s, _, _ in points], [t / 60 for _, t, _ in points])):
                ax.plot(xs, [p["success_rate"] for _, _, p in points], color=COLORS[variant], marker="o",
                        markersize=3, linewidth=1.2, alpha=0.8, label=LABELS[variant] if i == 0 else None)
                ax.fill_between(xs, [p["success_rate_ci"][0] for _, _, p in points],  # each seed's 95% interval
                                [p["success_rate_ci"][1] for _, _, p in points], color=COLORS[variant], alpha=0.08)
    for ax, xlabel in zip(axes, ("learner steps", "wall-clock of the steps (min)")):
        ax.set_xlabel(xlabel)
        ax.set_title("success on unseen items (greedy)")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)


def reading(means: dict[str, float], ranges: dict[str, tuple[float, float]], eta: int, n_seeds: int,
            staleness: dict[str, float]) -> list[str]:
    order = sorted(means, key=means.get, reverse=True)
    text = f"{LABELS[order[0]]} ({means[order[0]]:.3f})"
    for before, v in zip(order, order[1:]):
        text += f" {'=' if means[v] == means[before] else '>'} {LABELS[v]} ({means[v]:.3f})"
    lines = [f"Ordering of the mean final success rate: {text}."]
    line, above = compare(LABELS["decoupled"], LABELS["coupled"], means, ranges, "decoupled", "coupled", n_seeds)
    lines.append(line)
    lines.append(compare(LABELS["decoupled"], LABELS["sync"], means, ranges, "decoupled", "sync", n_seeds)[0])
    ahead = means["decoupled"] > means["coupled"]
    verdict = ("holds, with every seed of the decoupled loss above every seed of the coupled one" if above else
               "holds on its one seed" if ahead and n_seeds < 2 else
               "holds in the means, but not beyond the seed-to-seed spread" if ahead else "does not hold here")
    lines.append(f"The claim (at eta = {eta}, the correction trains better than the same loss without it) {verdict}"
                 + (f", over {n_seeds} seeds." if n_seeds > 1 else "."))
    if max(staleness.get("decoupled", 0.0), staleness.get("coupled", 0.0)) < 1.0:
        lines.append("The trained tokens were less than one version stale on average: at this staleness the two "
                     "losses differ little, whatever the bound allowed.")
    if n_seeds < 2:
        lines.append("With one seed there is no seed-to-seed spread to compare against: this is a single draw.")
    return lines


def paired(curves: Curves, a: str = "decoupled", b: str = "coupled") -> list[str]:
    """Seed by seed (same seed, same items), `a` minus `b`: at the final evaluation and averaged over every step
    both evaluated (how much sooner one learns); empty when no seed ran both."""
    seeds = sorted(set(curves.get(a, {})) & set(curves.get(b, {})))
    if not seeds:
        return []
    finals, averages = [], []
    for seed in seeds:
        at = {v: {step: p["success_rate"] for step, _, p in curves[v][seed]} for v in (a, b)}
        steps = sorted(set(at[a]) & set(at[b]))
        finals.append(at[a][max(at[a])] - at[b][max(at[b])])
        averages.append(sum(at[a][s] - at[b][s] for s in steps) / len(steps))
    ahead = sum(d > 0 for d in finals)
    said = ", ".join(f"{d:+.3f} (seed {s})" for d, s in zip(finals, seeds))
    over = ", ".join(f"{d:+.3f}" for d in averages)
    return [f"Seed by seed, {LABELS[a]} minus {LABELS[b]} at the final evaluation: {said}; ahead on {ahead} of "
            f"{len(seeds)}. Averaged over the steps both evaluated: {over}."]


def write_report(path: Path, runs: dict[str, dict[int, Path]], args: argparse.Namespace, command: str,
                 minutes: float, today: str, slots: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_suffix(".png")
    evals = {v: {s: final_eval(d) for s, d in by_seed.items()} for v, by_seed in runs.items()}
    base = next((ev for by_seed in evals.values() for ev in by_seed.values() if "random" in ev), None)
    curves = {v: {seed: unseen_curve(d) for seed, d in by_seed.items()} for v, by_seed in runs.items()}
    plot(curves, base.get("untrained") if base else None, png)
    items = next(iter(next(iter(evals.values())).values()))["items"]
    setup = f"`{args.config}`" + (" with " + " ".join(f"`{o}`" for o in args.overrides) if args.overrides else "")
    lines = [
        f"# Off-policy ablation: decoupled PPO with and without its correction at eta = {args.eta}", "",
        f"Produced by `{command}` on {today} ({os.cpu_count()} cores; {budget_line(runs)}; "
        f"{invocation_line(minutes)}).", "",
        f"Setup: {setup}; every run {args.steps} learner step{'s' if args.steps != 1 else ''}, env.slots_per_actor={slots} (so that {args.eta} "
        f"versions of batches can be in flight). Variants: decoupled PPO (ratio around the proximal policy, "
        f"importance weight truncated at algorithm.behaviour_weight_cap) and coupled (algorithm.policy_loss=coupled: "
        f"the behaviour logprobs as the proximal ones, the standard PPO ratio, no importance weight), both at "
        f"trainer.max_staleness={args.eta}; and eta = 0, the synchronous reference. Seeds "
        f"{', '.join(map(str, args.seeds))} (trainer, generator and learner seed). Evaluations: greedy, at "
        f"{args.eval_turns} turns, on {items}" + (f", every {args.eval_every} steps and at the end." if args.eval_every
                                                   else ", at the end."), "",
        "## Final evaluation", "",
        "| variant | seed | steps | minutes of steps | mean staleness (max) | success rate [95% interval] |",
        "|---|---|---|---|---|---|"]
    means, ranges, stale = {}, {}, {}
    for variant, by_seed in evals.items():
        ages = []
        for seed, ev in sorted(by_seed.items()):
            step, seconds, _ = curves[variant][seed][-1]
            age, oldest = mean_staleness(runs[variant][seed])
            ages.append(age)
            lines.append(f"| {LABELS[variant]} | {seed} | {step} | {seconds / 60:.1f} | {age:.2f} ({oldest:.0f}) | "
                         f"{fmt(ev['model'])} |")
        means[variant], ranges[variant] = spread([ev["model"]["success_rate"] for ev in by_seed.values()])
        stale[variant] = sum(ages) / len(ages)
    lines += ["", "| variant | mean over seeds | seed range |", "|---|---|---|"]
    lines += [f"| {LABELS[v]} | {means[v]:.3f} | {ranges[v][0]:.3f}–{ranges[v][1]:.3f} |" for v in means]
    if base is not None:
        lines += ["", "Baselines on the same items: random policy " + fmt(base["random"])
                  + ("; untrained model " + fmt(base["untrained"]) if "untrained" in base else "") + "."]
    lines += ["", "## Curves", "", f"![success on unseen items against learner steps and wall-clock]({png.name})", "",
              "Wall-clock: the sum of the steps' own seconds (waiting for a batch, training, publishing the weights; "
              "start-up and the evaluations left out). The untrained model stands at step 0.", "", "## Reading", ""]
    lines += [f"- {line}" for line in reading(means, ranges, args.eta, len(args.seeds), stale)]
    lines += [f"- {line}" for line in paired(curves)]
    path.write_text("\n".join(lines) + "\n")
