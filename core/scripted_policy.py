"""A policy that writes scripted replies instead of sampling them, for tests and env benchmarks.

It is a stand-in for the generator wherever the thing under test is the env, the pool or the transport rather
than the model: a function chooses the reply text from the conversation so far, and the reply's tokens are
marked as sampled by policy version `version` with logprob 0 (probability 1, which is what a deterministic
script has). It never stands in for the generator in a test of generation or learning.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from core.policy import GenerationRequest, GenerationResult


class ScriptedPolicy:
    def __init__(self, tokenizer, choose: Callable[[str], str], version: int = 0, delay_s: float = 0.0):
        """`choose(conversation_text) -> reply text`; `delay_s` simulates generation time."""
        self.tok = tokenizer
        self.choose = choose
        self.version = version
        self.delay_s = delay_s
        self.calls = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        text = self.tok.decode(request.prompt_ids, skip_special_tokens=False)
        reply = list(self.tok.encode(self.choose(text), add_special_tokens=False))
        if len(reply) + 1 <= request.max_tokens:
            ids, finish = reply + [self.tok.eos_token_id], "stop"
        else:  # cut at the token limit, as a sampler would be
            ids, finish = reply[: request.max_tokens], "length"
        return GenerationResult(token_ids=ids, logprobs=[0.0] * len(ids), versions=[self.version] * len(ids),
                                finish_reason=finish)
