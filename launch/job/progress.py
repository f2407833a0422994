"""The training progress bar: step, reward, success rate, valid actions, tokens/s and staleness, and the time
the evaluation after training should take, so the bar's estimate covers the whole run.

The evaluation estimate: its episodes times their turn limit (an upper bound on turns) times the generated
tokens per turn seen in training, over the generation throughput seen in training. Evaluation samples greedily
and at the evaluation's turn limit, so it is a rough bound, refreshed every step.

The time left for training is the steps left at the rate of the last `RECENT` steps (not the run's mean, nor
tqdm's own estimate, which it replaces): a run whose steps slow down (a growing cache, a role that swaps) shows
it in its estimate within a few steps. The bar also shows the largest role's resident memory
(`perf/rss_mb/*`, launch/job/role_stats.py).
"""
from __future__ import annotations

import sys
import time
from collections import deque

RECENT = 5  # steps whose rate the estimate uses


def eval_seconds(eval_turns: int, m: dict[str, float]) -> float | None:
    """Seconds for `eval_turns` turns at this step's tokens per turn and generation rate (None: unknown yet)."""
    turns, tokens, rate = m.get("rollout/turns_mean", 0), m.get("rollout/gen_tokens_mean", 0), \
        m.get("perf/gen_tokens_per_s", 0)
    if not eval_turns or turns <= 0 or tokens <= 0 or rate <= 0:
        return None
    return eval_turns * (tokens / turns) / rate


def eta_seconds(recent: "deque[tuple[int, float]]", total: int) -> float | None:
    """Seconds left for the steps up to `total` at the rate of the (step, time) pairs in `recent`."""
    if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
        return None
    (first, t0), (last, t1) = recent[0], recent[-1]
    return max(total - last, 0) * (t1 - t0) / (last - first)


def _clock(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{int(seconds % 60):02d}" if minutes >= 60 else \
        f"{minutes}:{int(seconds % 60):02d}"


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True, eval_turns: int = 0):
        """`eval_turns`: the evaluation's episodes times their turn limit (0: no evaluation after training)."""
        self.bar, self.eval_turns, self.total = None, eval_turns, total
        self.recent: deque[tuple[int, float]] = deque([(initial, time.monotonic())], maxlen=RECENT + 1)
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr,
                            dynamic_ncols=True,  # tqdm's own estimate left out: the postfix has the recent one
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

    def update(self, step: int, m: dict[str, float], now: float | None = None) -> None:
        self.recent.append((step, time.monotonic() if now is None else now))
        if self.bar is None:
            return
        evaluation = eval_seconds(self.eval_turns, m)
        left = eta_seconds(self.recent, self.total)
        rss = max((v for k, v in m.items() if k.startswith("perf/rss_mb/")), default=0.0)
        self.bar.set_postfix_str(
            f"reward {m.get('rollout/reward_mean', 0):.3f} success {m.get('rollout/success_rate', 0):.2f} "
            f"valid {m.get('rollout/valid_action_frac', 0):.2f} tok/s gen {m.get('perf/gen_tokens_per_s', 0):.0f} "
            f"train {m.get('perf/train_tokens_per_s', 0):.0f} staleness {m.get('staleness/mean', 0):.2f} "
            f"dropped {m.get('staleness/dropped_frac', 0):.0%} turns<={int(m.get('rollout/horizon_in_force', 0))}"
            + (f" rss<= {rss / 1024:.1f} GB" if rss else "")
            + (f" | eta {_clock(left)} at the last {len(self.recent) - 1} steps' rate" if left is not None else "")
            + (f" | then eval <= {evaluation / 60:.0f} min" if evaluation is not None else ""),
            refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
