"""The real training job (`launch.train`), with a pause inside every learner step, for tests that must land a
signal in the middle of one: `python -m tests.slow_step_run PAUSE_S [key=value ...]`.

The pause runs where the learner's step runs (in the coordinator's `train_step` call, before the learner
computes), so to the coordinator it is a learner step that takes PAUSE_S longer. Before each pause it appends
`{"step": N, "t": ...}` to `<output_dir>/learner_steps.jsonl`, which tells a test the step has begun. Everything
else is the real job; a stand-in is needed only because no real step on the tiny model is long enough to aim at.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


class PausingLearners:
    """The run's learner group, pausing `pause_s` at the start of each step after announcing it."""

    def __init__(self, inner, pause_s: float, marker: Path, first_step: int):
        self.inner, self.pause_s, self.marker, self.step = inner, pause_s, marker, first_step

    def train_step(self, trajectories):
        self.step += 1
        with open(self.marker, "a") as f:
            f.write(json.dumps({"step": self.step, "t": time.time()}) + "\n")
        time.sleep(self.pause_s)
        return self.inner.train_step(trajectories)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main(argv: list[str]) -> int:
    pause_s, overrides = float(argv[0]), argv[1:]
    from launch.job import session as session_module
    from launch.train import main as train

    original = session_module.TrainingSession.start

    def start(self) -> None:
        original(self)
        self.coordinator.learners = PausingLearners(self.coordinator.learners, pause_s,
                                                    self.out / "learner_steps.jsonl", self.state.step)

    session_module.TrainingSession.start = start
    return train(overrides)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
