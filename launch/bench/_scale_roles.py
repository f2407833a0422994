"""Stand-ins for the model roles in the scale benchmark: the control plane is what is measured, not a model.

- `EchoGenerator` implements the generator's interface as the policy client calls it (`generate`, `end_session`,
  `load`, `get_stats`) and answers every request at once with one fixed, valid action of the family (TextCraft's
  `inventory`), stamped with the current policy version. It notes when each session's first request arrived,
  which with an instant answer is when its first token would be sampled.
- `InstantLearners` is the coordinator's `learners` object (`train_step`, `publish_weights`, `wait_acks`): it
  consumes a batch at once, bumps the version, and tells the generator stand-in, so tokens carry real versions
  and the staleness filter sees them.
- `ShippedLearners` does what the real learner group does with a batch before any model sees it: advantages
  over the batch (`actors.learner.prepare_samples`), shards per rank (`core.batching.shard`) and each shard
  shipped through Ray to a rank actor (`ConsumingRank`, another process), which reads every sample and returns a
  step's metrics; only the model's forward and backward are left out.
"""
from __future__ import annotations

import time
from typing import Any

from core.policy import GenerationRequest, GenerationResult

TEXTCRAFT_REPLY = "Thought:\nI check what I hold first.\n\nAction:\ninventory"


class EchoGenerator:
    def __init__(self, reply_ids: list[int], max_sessions_noted: int = 200_000):
        self.reply_ids = list(reply_ids)
        self.version = 0
        self.requests = 0
        self.sessions: set[str] = set()
        self.first_seen: dict[str, float] = {}  # session id -> wall time of its first request
        self.max_sessions_noted = max_sessions_noted

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests += 1
        if request.session_id not in self.sessions:
            self.sessions.add(request.session_id)
            if len(self.first_seen) < self.max_sessions_noted:
                self.first_seen[request.session_id] = time.time()
        ids = self.reply_ids[: request.max_tokens]
        return GenerationResult(token_ids=ids, logprobs=[0.0] * len(ids), versions=[self.version] * len(ids),
                                finish_reason="stop" if len(ids) == len(self.reply_ids) else "length")

    async def end_session(self, session_id: str) -> None:
        self.sessions.discard(session_id)

    async def load(self) -> dict:
        return {"sessions": len(self.sessions), "waiting": 0, "capacity": 1 << 30, "inflight": 0}

    async def get_stats(self) -> dict:
        return {"requests": self.requests, "sessions": len(self.sessions), "version": self.version}

    async def set_version(self, version: int) -> None:
        self.version = version

    async def take_first_seen(self) -> dict[str, float]:
        """The first-request times noted since the last call (and forget them)."""
        out, self.first_seen = self.first_seen, {}
        return out


class InstantLearners:
    def __init__(self, generator: Any):
        self.generator = generator
        self.version = 0
        self.steps = 0
        self.trained_groups: set[int] = set()
        self.trained_trajectories = 0
        self.trained_twice = 0  # a group trained by two steps: must stay 0

    def train_step(self, trajectories: list) -> dict[str, float]:
        groups = {int(t.group_id[1:8]) for t in trajectories}  # the counter of `g<counter>-<item>`
        self.trained_twice += len(groups & self.trained_groups)
        self.trained_groups |= groups
        self.trained_trajectories += len(trajectories)
        self.steps += 1
        return {"train/loss": 0.0}

    def publish_weights(self) -> dict[str, int]:
        self.version += 1
        # Not waited for: behind thousands of queued generate calls the stand-in would hold the coordinator's loop
        # (a real publish is a ZMQ fan-out); its tokens carry the new version as soon as the call runs.
        self.generator.set_version.remote(self.version)
        return {"version": self.version}

    def wait_acks(self, version: int, timeout_s: float, excused=()) -> dict:
        return {"echo-generator": (True, "")}


class ConsumingRank:
    """A learner rank that receives its shard through Ray, as a real rank does, and reads every sample."""

    def train_step(self, samples: list) -> dict[str, float]:
        tokens = sum(s.trajectory.num_tokens for s in samples)
        advantages = sum(s.advantages is not None for s in samples)  # attached by prepare_samples
        return {"train/loss": 0.0, "train/rank_tokens": float(tokens),
                "train/samples_with_advantages": float(advantages)}


class ShippedLearners(InstantLearners):
    def __init__(self, generator: Any, ranks: int = 1):
        import ray

        from configs.learner import AlgorithmConfig

        super().__init__(generator)
        self.algorithm = AlgorithmConfig()
        self.ranks = [ray.remote(ConsumingRank).options(num_cpus=0).remote() for _ in range(ranks)]
        self.rank_tokens, self.samples_with_advantages = 0.0, 0.0

    def train_step(self, trajectories: list) -> dict[str, float]:
        import ray

        from actors.learner import prepare_samples
        from core.batching import shard

        super().train_step(trajectories)  # the accounting: no group trained twice
        shards = shard(prepare_samples(trajectories, self.algorithm), len(self.ranks))
        got = ray.get([r.train_step.remote(s) for r, s in zip(self.ranks, shards)])
        self.rank_tokens += sum(g["train/rank_tokens"] for g in got)
        self.samples_with_advantages += sum(g["train/samples_with_advantages"] for g in got)
        return got[0]
