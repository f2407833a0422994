"""Stand-ins for the model roles in the scale benchmark: the control plane is what is measured, not a model.

- `EchoGenerator` implements the generator's interface as the policy client calls it (`generate`, `end_session`,
  `load`, `get_stats`) and answers every request at once with one fixed, valid action of the family (TextCraft's
  `inventory`), stamped with the current policy version. It notes when each session's first request arrived,
  which with an instant answer is when its first token would be sampled.
- `InstantLearners` is the coordinator's `learners` object (`train_step`, `publish_weights`, `wait_acks`): it
  consumes a batch at once, bumps the version, and tells the generator stand-in, so tokens carry real versions
  and the staleness filter sees them.
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
