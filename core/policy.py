"""What the rollout loop asks of a policy: token ids in, sampled token ids out, with logprobs and versions.

A `Policy` is implemented by the vLLM generator (through a router over replicas) and, in tests and
benchmarks, by scripted policies that sample nothing (they say so in their docstrings).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class GenerationRequest:
    prompt_ids: list[int]  # the whole episode so far: the model continues it
    max_tokens: int
    session_id: str  # the episode's id: requests of one session go to one replica (prefix cache)
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0  # no end-of-turn or stop token before this many tokens (<= max_tokens)
    item_id: str = ""  # the episode's item and sample: a policy that samples nothing (the random baseline)
    sample_index: int = 0  # seeds itself from them; generators ignore both
    priority: int = 0  # lower is served first when the generator schedules by priority (the group's start order)


@dataclass
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float]  # behaviour logprob of each sampled token
    versions: list[int]  # policy version that sampled each token (changes mid-turn on an abort-update)
    finish_reason: str  # "stop" (end-of-turn token sampled), "length", or "abort"

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.logprobs) == len(self.versions):
            raise ValueError(f"generation result lengths differ: {len(self.token_ids)} tokens, "
                             f"{len(self.logprobs)} logprobs, {len(self.versions)} versions")


class PolicyLost(RuntimeError):
    """The replica serving an episode died: the episode cannot continue and ends `lost` (not an env's fault)."""


class Policy(Protocol):
    async def generate(self, request: GenerationRequest) -> GenerationResult: ...


# Optional on a policy: `async def end_session(self, session_id: str) -> None`. `run_episode` calls it once when
# an episode ends (however it ends), so a generator can free the episode's admission slot at once instead of
# waiting for it to go idle. Policies without per-episode state (scripted ones) simply don't define it.
END_SESSION = "end_session"
