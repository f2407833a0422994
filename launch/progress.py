"""The training progress bar: step, reward, success rate, valid actions, tokens/s and staleness, and the time
the evaluation after training should take, so the bar's estimate covers the whole run.

The evaluation estimate: its episodes times their turn limit (an upper bound on turns) times the generated
tokens per turn seen in training, over the generation throughput seen in training. Evaluation samples greedily
and at the evaluation's turn limit, so it is a rough bound, refreshed every step.
"""
from __future__ import annotations

import sys


def eval_seconds(eval_turns: int, m: dict[str, float]) -> float | None:
    """Seconds for `eval_turns` turns at this step's tokens per turn and generation rate (None: unknown yet)."""
    turns, tokens, rate = m.get("rollout/turns_mean", 0), m.get("rollout/gen_tokens_mean", 0), \
        m.get("perf/gen_tokens_per_s", 0)
    if not eval_turns or turns <= 0 or tokens <= 0 or rate <= 0:
        return None
    return eval_turns * (tokens / turns) / rate


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True, eval_turns: int = 0):
        """`eval_turns`: the evaluation's episodes times their turn limit (0: no evaluation after training)."""
        self.bar, self.eval_turns = None, eval_turns
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr,
                            dynamic_ncols=True)

    def update(self, step: int, m: dict[str, float]) -> None:
        if self.bar is None:
            return
        evaluation = eval_seconds(self.eval_turns, m)
        self.bar.set_postfix_str(
            f"reward {m.get('rollout/reward_mean', 0):.3f} success {m.get('rollout/success_rate', 0):.2f} "
            f"valid {m.get('rollout/valid_action_frac', 0):.2f} tok/s gen {m.get('perf/gen_tokens_per_s', 0):.0f} "
            f"train {m.get('perf/train_tokens_per_s', 0):.0f} staleness {m.get('staleness/mean', 0):.2f} "
            f"dropped {m.get('staleness/dropped_frac', 0):.0%} turns<={int(m.get('rollout/horizon_in_force', 0))}"
            + (f" | then eval <= {evaluation / 60:.0f} min" if evaluation is not None else ""),
            refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
