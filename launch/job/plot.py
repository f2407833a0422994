"""The run's PNG: reward, success rate and valid-action fraction over learner steps, from metrics.jsonl."""
from __future__ import annotations

from pathlib import Path

from core.metrics import read_jsonl

SERIES = (("rollout/reward_mean", "reward (mean)"), ("rollout/success_rate", "success rate"),
          ("rollout/valid_action_frac", "valid-action fraction"))


def plot_run(metrics_path: str | Path, out_png: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_jsonl(metrics_path) if "rollout/reward_mean" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for key, label in SERIES:
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    horizons = [(r["step"], r["rollout/horizon"]) for r in rows if "rollout/horizon" in r]
    for (s0, h0), (s1, h1) in zip(horizons, horizons[1:]):
        if h1 != h0:
            ax.axvline(s1, color="grey", linestyle=":", linewidth=1)
            ax.text(s1, 1.02, f"{int(h1)} turns", fontsize=8, color="grey", transform=ax.get_xaxis_transform())
    ax.set_xlabel("learner step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(title or "training")
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out)
    plt.close(fig)
    return out
