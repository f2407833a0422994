"""`python -m launch.bench generator`: generation throughput, weight-sync latency and multi-turn throughput.

All in one run, side by side, with the default model unless `--model` says otherwise:
1. Single turn: `--episodes` BabyAI-like prompts (the chat template over a grid-world instruction and
   observation) sampled at once through our generator actor (Ray actor, AsyncLLM, PolicyClient), then the same
   prompts through vLLM's offline `LLM.generate` with the same engine settings, then Hugging Face `generate`
   one request at a time on the first `--hf-requests` of them, and batched on all of them (left-padded, one
   `generate` call). Figures: tokens/s of each and the ratios `actor_over_offline` (target >= 0.8),
   `actor_over_hf` (one at a time) and `actor_over_hf_batched`. HF runs in a process of its own with HF's
   default threading (launch/bench/hf_baseline.py): the OpenMP setting this bench gives itself for the offline
   engine (the generator actor's `OMP_WAIT_POLICY`) is not HF's.
2. Weight sync: the model's full weights published on the weights channel until the actor acked, versus a
   memcpy of the same bytes: `weight_sync_over_memcpy` (target <= 10) through the same-node path the run uses
   (the learner's shared memory, once the actor proved it shares this node), and `weight_sync_tcp_over_memcpy`
   over TCP, versions of the two taken in turn; the actor's own apply time, its staging copy and its engine's
   load too. Those start from float32 weights already in host memory; `weight_sync_over_memcpy_from_shards`
   starts where a learner does, from a ZeRO-3 engine's partitioned parameters, and counts the gather, the cast
   to the generator's dtype and the publish until the ack (launch/bench/weights_shards.py).
3. Multi-turn: `--mt-episodes` episodes of `--mt-turns` turns, all started at once through the real rollout
   loop against a synthetic grid env that answers at once. The generator admits as many episodes at a time as
   its KV cache holds at the budgeted episode length; the rest wait for a slot. Tokens/s by turn index are read
   from a timeline of finished requests (each time bin is attributed to the turn with most tokens in it):
   `turn10_over_turn1` (target >= 0.7; the last turn when --mt-turns differs).

The KV cache (`--kv-gb`, default: the generator config's 2 GiB) is the same for the actor and the offline engine.
The actor's admission budget is set per phase (`set_session_tokens`): a single-turn episode needs its prompt and
reply, a multi-turn one its whole conversation. `--quick` shrinks everything for a 2-core smoke run. Timings on
a shared machine are noisy: read the ratios, which are measured minutes apart in the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np

from core.chat import ChatFormat
from core.env import Env, Observation, StepResult
from core.models import resolve_model
from core.policy import GenerationRequest, GenerationResult
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from launch.bench.report import emit, table

INSTRUCTION = (
    "You are an explorer in a grid world, and your job is to achieve the goal you are given. Each turn you get an "
    "observation of what you can see in front of you, followed by the actions you can take right now. Answer with "
    "your reasoning and then exactly one of the available actions.\n\nThe actions:\n- turn left / turn right: turn "
    "in place by a quarter turn.\n- move forward: step one cell ahead.\n- go to <object> <n>: walk up to that "
    "object and face it, e.g. \"go to red ball 1\".\n- pick up <object> <n>: walk up to that object and pick it "
    "up. You can carry one object at a time.\n- drop: put the object you carry down in front of you.\n- toggle: "
    "open or close the door in front of you.\n\nUse exactly this format:\nThought:\n<your reasoning>\n\nAction:\n"
    "<one available action>")
COLORS = ["red", "green", "blue", "purple", "yellow", "grey"]
KINDS = ["ball", "box", "key"]


def observation(rng: random.Random, with_goal: bool) -> str:
    objects = [f"{rng.choice(COLORS)} {rng.choice(KINDS)} {k + 1}" for k in range(rng.randint(2, 4))]
    seen = ", ".join(f"a {o} {rng.randint(1, 6)} steps {rng.choice(['ahead', 'to the left', 'to the right'])}"
                     for o in objects)
    actions = ["turn left", "turn right", "move forward"] + [f"go to {o}" for o in objects] + \
              [f"pick up {o}" for o in objects[:2]]
    goal = f"Your goal: go to the {objects[0][:-2]}.\n" if with_goal else ""
    return f"{goal}In front of you in this room, you can see several objects: {seen}. The room has walls around " \
           f"you.\nAvailable actions: {json.dumps(actions)}"


class GridLikeEnv(Env):
    """Answers every step at once with a fresh BabyAI-like observation and never ends: generation is measured."""

    family = "gridlike"

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    async def reset(self, item_id: str) -> Observation:
        return Observation(text=observation(self.rng, True), instruction=INSTRUCTION)

    async def step(self, text: str) -> StepResult:
        await asyncio.sleep(0)
        return StepResult(observation=observation(self.rng, False), reward=0.0, done=False, valid_action=False,
                          parse_rule="none")


class TimedPolicy:
    """Records (turn index, end time, tokens) for every request of the multi-turn phase."""

    def __init__(self, inner):
        self.inner = inner
        self.turn: dict[str, int] = {}
        self.records: list[tuple[int, float, int]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        k = self.turn.get(request.session_id, 0)
        self.turn[request.session_id] = k + 1
        out = await self.inner.generate(request)
        self.records.append((k + 1, time.monotonic(), len(out.token_ids)))
        return out

    async def end_session(self, session_id: str) -> None:
        await self.inner.end_session(session_id)


def rates_by_turn(records: list[tuple[int, float, int]], start: float, bins: int = 60) -> dict[int, float]:
    """Tokens/s by turn: the timeline of finished requests in equal bins, each bin going to its main turn."""
    end = max(t for _, t, _ in records)
    width = max((end - start) / bins, 1e-3)
    per_bin = [dict() for _ in range(bins)]
    for turn, t, n in records:
        b = min(bins - 1, int((t - start) / width))
        per_bin[b][turn] = per_bin[b].get(turn, 0) + n
    tokens: dict[int, float] = {}
    seconds: dict[int, float] = {}
    for counts in per_bin:
        if counts:
            main = max(counts, key=counts.get)
            tokens[main] = tokens.get(main, 0) + sum(counts.values())
            seconds[main] = seconds.get(main, 0) + width
    return {k: tokens[k] / seconds[k] for k in sorted(tokens)}


def kv_bytes_per_token(model_dir: Path, dtype: str) -> int:
    c = json.loads((model_dir / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * kv_heads * head_dim * (4 if dtype == "float32" else 2)


# -- phases -------------------------------------------------------------------------------------------------------

async def single_turn(client, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[int, float]:
    async def one(i: int, prompt: list[int]) -> int:
        session = f"{tag}-{i}"
        out = await client.generate(GenerationRequest(prompt, max_tokens, session))
        await client.end_session(session)
        return len(out.token_ids)

    t0 = time.monotonic()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return sum(counts), time.monotonic() - t0


def weight_sync(publisher, handle, model_dir: Path, reps: int) -> dict[str, float]:
    import ray
    from safetensors.numpy import load_file

    from core.weights.tensors import TensorBytes

    state = load_file(str(model_dir / "model.safetensors"))
    tensors = [TensorBytes(k, "float32", tuple(v.shape), np.ascontiguousarray(v, np.float32).data)
               for k, v in state.items()]
    nbytes = sum(t.data.nbytes for t in tensors)
    version = ray.get(handle.get_stats.remote())["version"]
    deadline = time.monotonic() + 30
    while not publisher.same_node and time.monotonic() < deadline:
        publisher.poll(20)
    near = set(publisher.same_node)  # the replica, once it proved it reads this process's shared memory
    paths = ["shm", "tcp"] if near else ["tcp"]
    if not near:
        print("note: the generator did not prove it shares this node's memory: TCP only", flush=True)
    sync, apply, stages = {p: [] for p in paths}, {p: [] for p in paths}, {p: [] for p in paths}
    for r in range(reps):
        for path in paths:  # in turn, so that both see the same machine
            publisher.same_node.clear()
            publisher.same_node.update(near if path == "shm" else ())
            version += 1
            t0 = time.perf_counter()
            publisher.publish(version, tensors)
            acks = publisher.wait_acks(version, timeout_s=600)
            sync[path].append(time.perf_counter() - t0)
            if not all(ok for ok, _ in acks.values()):
                raise RuntimeError(f"weights version {version} refused: {acks}")
            stats = ray.get(handle.get_stats.remote())
            apply[path].append(stats["last_update_s"])
            stages[path].append(stats["last_update_stages"])
    publisher.same_node.update(near)
    src = np.frombuffer(b"".join(bytes(t.data) for t in tensors), np.uint8)
    dst = np.empty_like(src)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - t0)
    memcpy = min(copies[1:])
    figures = {"weight_bytes": float(nbytes), "memcpy_s": memcpy}
    for path in paths:  # the run's path (shm on one node) unsuffixed, TCP beside it
        key = "" if path == paths[0] else "_tcp"
        figures.update({
            f"weight_sync{key}_s": statistics.median(sync[path]),
            f"weight_apply{key}_s": statistics.median(apply[path]),
            f"weight_staging{key}_s": statistics.median(x[0] for x in stages[path]),
            f"weight_engine_load{key}_s": statistics.median(x[2] for x in stages[path]),
            f"weight_sync{key}_over_memcpy": statistics.median(sync[path]) / memcpy,
            f"weight_apply{key}_over_memcpy": statistics.median(apply[path]) / memcpy})
    figures["weight_path_shm"] = float(bool(near))
    return figures


async def multi_turn(client, chat: ChatFormat, episodes: int, turns: int, max_tokens: int,
                     max_context: int) -> tuple[dict[int, float], float, int]:
    from tqdm import tqdm

    timed = TimedPolicy(client)
    limits = EpisodeLimits(max_tokens_per_turn=max_tokens, max_context_tokens=max_context)
    bar = tqdm(total=episodes, desc="multi-turn episodes", unit="ep")

    async def one(i: int):
        spec = EpisodeSpec(f"mt-{i}", f"gridlike_{i}", f"g-{i}", 0, horizon=turns)
        traj = await run_episode(GridLikeEnv(1000 + i), timed, chat, spec, limits)
        bar.update()
        return traj

    start = time.monotonic()
    trajs = await asyncio.gather(*(one(i) for i in range(episodes)))
    bar.close()
    short = sum(t.num_turns < turns for t in trajs)
    return rates_by_turn(timed.records, start), time.monotonic() - start, short


def offline(model_dir: Path, prompts: list[list[int]], max_tokens: int, args) -> tuple[int, float]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: the leanest offline setup
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), dtype=args.dtype, kv_cache_memory_bytes=int(args.kv_gb * (1 << 30)),
              max_num_seqs=args.max_num_seqs, enable_prefix_caching=True, enforce_eager=not args.compile,
              distributed_executor_backend="uni", seed=0, max_model_len=args.max_model_len,
              logprobs_mode="processed_logprobs", disable_log_stats=True)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, logprobs=0, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
    t0 = time.monotonic()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.monotonic() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    gc.collect()
    return tokens, elapsed


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.bench generator", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="model.path: `default`, a local folder or a hub name")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--episodes", type=int, default=64, help="concurrent single-turn episodes")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per single-turn reply")
    p.add_argument("--hf-requests", type=int, default=4, help="prompts for the one-at-a-time HF baseline")
    p.add_argument("--weight-reps", type=int, default=3, help="weight versions published (median reported)")
    p.add_argument("--mt-episodes", type=int, default=160, help="multi-turn episodes in flight")
    p.add_argument("--mt-turns", type=int, default=10)
    p.add_argument("--mt-tokens", type=int, default=32, help="tokens per multi-turn reply")
    p.add_argument("--kv-gb", type=float, default=0.0, help="KV cache of each engine (0: the config default)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--compile", action="store_true", help="let vLLM compile (slow start); default is eager")
    p.add_argument("--skip", default="", help="comma list of phases to skip: offline,hf,weights,multiturn")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run on 2 cores")
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.max_tokens, args.hf_requests, args.weight_reps = 16, 32, 2, 1
        args.mt_episodes, args.mt_tokens = 32, 16
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    skip = set(filter(None, args.skip.split(",")))
    from configs.generation import GeneratorConfig

    # The offline engine runs in this process: give it the generator actor's OpenMP setting, before torch loads.
    policy = GeneratorConfig().cpu_omp_wait_policy
    restore = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")}  # what the HF process gets back
    if policy:
        os.environ["OMP_WAIT_POLICY"] = policy
    from transformers import AutoTokenizer

    from actors.policy_client import PolicyClient
    from core.weights.publisher import WeightPublisher
    from launch.job.generators import start_generators, stop_generators
    from launch.job.ray_cluster import connect, shutdown

    model_dir = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatFormat(tok)
    rng = random.Random(0)
    prompts = [chat.start(INSTRUCTION, observation(rng, True)) for _ in range(args.episodes)]
    # An episode's KV budget: its start, then per turn a reply, its closing and the next observation.
    obs_tokens = max(len(chat.user_turn(observation(rng, False))) for _ in range(50))
    budget = max(len(p) for p in prompts) + args.mt_turns * (args.mt_tokens + len(chat.closing(False)) + obs_tokens)
    budget = min(budget, args.max_model_len)
    single_budget = max(len(p) for p in prompts) + args.max_tokens
    per_token = kv_bytes_per_token(model_dir, args.dtype)
    args.kv_gb = args.kv_gb or GeneratorConfig().kv_cache_gb
    print(f"model {model_dir.name} ({args.dtype}); prompts {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens; episode budget {single_budget} tokens single-turn, {budget} multi-turn; KV cache "
          f"{args.kv_gb} GiB = {int(args.kv_gb * (1 << 30) / per_token)} tokens", flush=True)

    figures: dict[str, float] = {}
    rows = []
    connect(num_cpus=os.cpu_count() or 2)
    publisher = WeightPublisher(shm=True)
    cfg = GeneratorConfig(kv_cache_gb=args.kv_gb, max_num_seqs=args.max_num_seqs, enforce_eager=not args.compile,
                          session_tokens=budget, num_cpus=float(os.cpu_count() or 2))
    t0 = time.monotonic()
    handles = start_generators(model_dir, cfg, dtype=args.dtype, max_model_len=args.max_model_len,
                               weights_endpoint=publisher.endpoint)
    publisher.wait_for_peers(1, timeout_s=60)
    import ray

    print(f"generator actor ready in {time.monotonic() - t0:.0f} s", flush=True)
    try:
        capacity = ray.get(handles[0].set_session_tokens.remote(single_budget))
        print(f"single turn: the actor admits {capacity} episodes at once", flush=True)
        asyncio.run(single_turn(PolicyClient(handles), prompts[:4], 8, "warm"))
        tokens, secs = asyncio.run(single_turn(PolicyClient(handles), prompts, args.max_tokens, "st"))
        figures["actor_tok_s"] = tokens / secs
        rows.append(("generator actor", len(prompts), tokens, secs, tokens / secs))
        if "weights" not in skip:
            figures.update(weight_sync(publisher, handles[0], model_dir, args.weight_reps))
            from launch.bench.weights_shards import weight_sync_from_shards

            shards = weight_sync_from_shards(publisher, handles[0], model_dir, args.dtype, args.weight_reps,
                                             ray.get(handles[0].get_stats.remote())["version"])
            shards.pop("version")
            figures.update(shards)
        if "multiturn" not in skip:
            capacity = ray.get(handles[0].set_session_tokens.remote(budget))
            print(f"multi-turn: the actor admits {capacity} of {args.mt_episodes} episodes at once", flush=True)
            rates, secs, short = asyncio.run(multi_turn(PolicyClient(handles), chat, args.mt_episodes,
                                                        args.mt_turns, args.mt_tokens, args.max_model_len))
            first, last = min(rates), max(rates)
            figures.update({"turn1_tok_s": rates[first], f"turn{last}_tok_s": rates[last],
                            "turn10_over_turn1": rates[last] / rates[first], "multiturn_s": secs,
                            "multiturn_capacity": float(capacity)})
            if short:
                print(f"note: {short} multi-turn episodes ended before turn {args.mt_turns} (context limit)")
            print(table(["turn", "tokens/s"], [(k, v) for k, v in rates.items()]), flush=True)
        stats = ray.get(handles[0].get_stats.remote())
        figures["admission_wait_s"] = stats["admission_wait_s"]
    finally:
        stop_generators(handles)
        publisher.close()
        shutdown()

    if "offline" not in skip:
        tokens, secs = offline(model_dir, prompts, args.max_tokens, args)
        figures["offline_tok_s"] = tokens / secs
        figures["actor_over_offline"] = figures["actor_tok_s"] / figures["offline_tok_s"]
        rows.append(("vLLM offline LLM.generate", len(prompts), tokens, secs, tokens / secs))
    if "hf" not in skip:
        import tempfile

        from launch.bench.hf_baseline import run_clean

        with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
            hf = run_clean(model_dir, prompts, args.max_tokens, args.hf_requests, args.dtype, Path(tmp) / "spec.json",
                           restore)
        print(f"HF baselines: their own process, {hf['torch_threads']} torch threads, OMP_WAIT_POLICY "
              f"{hf['omp_wait_policy'] or 'unset'}", flush=True)
        tokens, secs = hf["one_tokens"], hf["one_s"]
        figures["hf_tok_s"] = tokens / secs
        figures["actor_over_hf"] = figures["actor_tok_s"] / figures["hf_tok_s"]
        rows.append(("HF generate, one at a time", args.hf_requests, tokens, secs, tokens / secs))
        tokens, secs = hf["batched_tokens"], hf["batched_s"]
        figures["hf_batched_tok_s"] = tokens / secs
        figures["actor_over_hf_batched"] = figures["actor_tok_s"] / figures["hf_batched_tok_s"]
        rows.append(("HF generate, batched (left-padded)", len(prompts), tokens, secs, tokens / secs))
    print(table(["single turn", "requests", "tokens", "seconds", "tokens/s"], rows))
    if "weight_sync_s" in figures:
        mb, memcpy, rows = figures["weight_bytes"] / 1e6, figures["memcpy_s"], []
        for key, path in [("", "shared memory" if figures["weight_path_shm"] else "TCP"), ("_tcp", "TCP")]:
            if f"weight_sync{key}_s" not in figures:
                continue
            rows += [(f"{path}: publish -> ack (end to end)", mb, figures[f"weight_sync{key}_s"],
                      figures[f"weight_sync{key}_over_memcpy"]),
                     ("  apply in the generator", mb, figures[f"weight_apply{key}_s"],
                      figures[f"weight_apply{key}_over_memcpy"]),
                     ("    of which: copy to the staging file", mb, figures[f"weight_staging{key}_s"],
                      figures[f"weight_staging{key}_s"] / memcpy),
                     ("    of which: load in the engine", mb, figures[f"weight_engine_load{key}_s"],
                      figures[f"weight_engine_load{key}_s"] / memcpy)]
        if "weight_sync_from_shards_s" in figures:
            shard_mb, shard_copy = figures["weight_bytes_from_shards"] / 1e6, figures["memcpy_from_shards_s"]
            rows += [(f"from ZeRO-3 shards: gather + cast ({args.dtype}) + publish -> ack", shard_mb,
                      figures["weight_sync_from_shards_s"], figures["weight_sync_over_memcpy_from_shards"]),
                     ("  of which: gather + cast", shard_mb, figures["weight_gather_cast_s"],
                      figures["weight_gather_cast_s"] / shard_copy)]
        print(table(["weights", "MB", "seconds", "x memcpy"], rows + [("memcpy", mb, memcpy, 1.0)]))
    emit(figures)
    return 0
