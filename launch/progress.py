"""The training progress bar: step, reward, success rate, valid actions, tokens/s and staleness."""
from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr,
                            dynamic_ncols=True)

    def update(self, step: int, m: dict[str, float]) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix_str(
            f"reward {m.get('rollout/reward_mean', 0):.3f} success {m.get('rollout/success_rate', 0):.2f} "
            f"valid {m.get('rollout/valid_action_frac', 0):.2f} tok/s gen {m.get('perf/gen_tokens_per_s', 0):.0f} "
            f"train {m.get('perf/train_tokens_per_s', 0):.0f} staleness {m.get('staleness/mean', 0):.2f} "
            f"dropped {m.get('staleness/dropped_frac', 0):.0%} turns<={int(m.get('rollout/horizon_in_force', 0))}",
            refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
