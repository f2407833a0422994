"""A generator replica's end of the weights channel (ZeroMQ, core.weights.subscriber) and the in-place load that
every path shares: checking a version against the checkpoint, staging it (or reading the learner's shared
memory on this node), and swapping it into the paused engine. Mixed into actors.generator.Generator, whose
engine, gate, staging file and stats it uses; actors/generator.py says what must hold of an update.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from actors.weights.group_generator import WeightUpdateError
from actors.update_gate import ENGINE_PAUSE_MODE
from core.curve import CurveClient
from core.models import tensor_set_mismatch
from core.weights.subscriber import WeightSubscriber, chunk_frame_cap
from core.weights.tensors import TensorBytes, WeightSet

log = logging.getLogger("agentgym.generator")


class ChannelWeights:
    def _complete_set(self, weights: WeightSet) -> list[TensorBytes]:
        """Check names and shapes against the checkpoint; add lm_head.weight for tied embeddings."""
        tensors = dict(weights.tensors)
        expected = self._expected_sent
        if self._tied:
            if "lm_head.weight" not in expected:
                raise WeightUpdateError("tied embeddings but the checkpoint has no model.embed_tokens.weight")
            if "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
                e = tensors["model.embed_tokens.weight"]
                tensors["lm_head.weight"] = TensorBytes("lm_head.weight", e.dtype, e.shape, e.data)
        problem = tensor_set_mismatch({name: t.shape for name, t in tensors.items()}, expected)
        if problem:
            raise WeightUpdateError(f"version {weights.version}: {problem}")
        for name, t in tensors.items():
            if not t.dtype.startswith(("float", "bfloat")):
                raise WeightUpdateError(f"version {weights.version}: {name} has dtype {t.dtype}, expected a float")
        return list(tensors.values())

    async def apply_weights(self, weights: WeightSet, mode: str | None = None) -> float:
        """Apply a complete version in place; returns the seconds it took. Raises WeightUpdateError."""
        mode = mode or self.cfg.on_weight_update
        if mode not in ("finish", "abort"):
            raise ValueError(f"on_weight_update must be finish or abort, got {mode!r}")
        started = time.monotonic()
        try:
            if weights.version < self.version:  # the same version again is harmless (a re-broadcast)
                raise WeightUpdateError(f"version {weights.version} is older than the current {self.version}")
            tensors = self._complete_set(weights)
        except WeightUpdateError:
            self.stats.update_failures += 1
            raise
        async with self._update_lock:
            t0 = time.monotonic()
            if weights.shelf is not None:  # the learner's shared memory, on this node: the engine reads it there
                path, index = self._shelf_index(weights)
            else:
                path, index = await asyncio.to_thread(self._staging.write, tensors)  # requests still flow meanwhile
            direct = self.cfg.weights_load == "direct"
            await self._swap(weights.version, mode, "agentgym_load_weights", (path, index, direct), t0,
                             time.monotonic())
        return self._applied(weights.version, mode, started)

    async def load_folder(self, folder: str, version: int) -> float:
        """Apply the weights of a model folder as `version` (its tensors must fit this engine's model, as a
        learner's would): one engine serves several checkpoints in turn. Returns the seconds it took."""
        from core.models import folder_tensors

        tensors = await asyncio.to_thread(folder_tensors, folder)
        return await self.apply_weights(WeightSet(version, {t.name: t for t in tensors}), mode="finish")

    def _shelf_index(self, weights: WeightSet) -> tuple[str, list]:
        """A shelved version's file and index, with lm_head.weight pointing at the embedding for tied models."""
        path, index = weights.shelf
        names = {entry[0] for entry in index}
        if self._tied and "lm_head.weight" not in names:
            embed = next((e for e in index if e[0] == "model.embed_tokens.weight"), None)
            if embed is not None:
                index = [*index, ["lm_head.weight", *embed[1:]]]
        return path, index

    async def _swap(self, version: int, mode: str, method: str, args: tuple, t0: float, t1: float) -> None:
        """With the engine paused, run the worker's `method(*args)` (it loads the weights), then stamp `version`."""
        async with self._gate.closed():  # new requests wait here until the engine has resumed
            # `wait`: requests in flight finish first; `keep`: they stay in the engine and continue after the
            # resume on the new weights (preempted and recomputed if the cache is dropped: kv_cache_max_age).
            # Never `abort` (see update_gate.py).
            drop = self._kept_updates >= self.cfg.kv_cache_max_age  # kv_cache_max_age: what may stay cached
            await self.engine.pause_generation(mode=ENGINE_PAUSE_MODE[mode], clear_cache=drop)
            t2 = time.monotonic()
            try:
                try:
                    await self.engine.collective_rpc(method, args=args)
                    self.stats.last_update_stages = (t1 - t0, t2 - t1, time.monotonic() - t2)
                except Exception as exc:
                    self._failed_loads += 1
                    self._broken = (f"{self.name}: loading version {version} failed half-way, "
                                    f"weights are in an unknown state: {exc}")
                    self.stats.update_failures += 1
                    raise WeightUpdateError(self._broken) from exc
                if drop:
                    await self.engine.reset_prefix_cache()
                self._kept_updates = 0 if drop else self._kept_updates + 1
                await self.engine.update_weight_version(str(version))
                self._version_set = True
                self.version = version
                self._broken = ""
                self._weights_applied.set()
            finally:
                await self.engine.resume_generation()

    def _applied(self, version: int, mode: str, started: float) -> float:
        elapsed = time.monotonic() - started
        self.stats.updates += 1
        self.stats.last_update_s = elapsed
        log.info("%s: applied weights version %d (%s mode) in %.2f s", self.name, version, mode, elapsed)
        return elapsed

    async def subscribe_weights(self, endpoint: str, curve: CurveClient | None = None, relay_host: str | None = None,
                                relay_advertise: str = "", chunk_bytes: int = 64 << 20) -> None:
        """Start the background thread that receives versions from the weights channel, applies and acks them.
        `curve`: this replica's credentials when the channel is authenticated. `relay_host`: bind a forwarding
        socket there and relay chunks to the next replica (core.weights.relay; None: receive only);
        `relay_advertise`: this node's address, when `relay_host` is a wildcard. `chunk_bytes`: the publisher's
        chunk size (transport.weights_chunk_mb): no frame on this replica's sockets may be larger, so that is all
        an outsider's unfinished handshake can make it hold (core.weights.subscriber.chunk_frame_cap)."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already subscribes to the weights channel")
        loop = asyncio.get_running_loop()
        ready = threading.Event()
        relay = (relay_host, relay_advertise)
        self._thread = threading.Thread(target=self._weights_loop, args=(endpoint, curve, loop, ready, relay,
                                                                         chunk_bytes),
                                        name=f"{self.name}-weights", daemon=True)
        self._thread.start()
        await asyncio.to_thread(ready.wait, 30)
        if self._weights_error:
            raise RuntimeError(self._weights_error)

    def _weights_loop(self, endpoint: str, curve: CurveClient | None, loop: asyncio.AbstractEventLoop,
                      ready: threading.Event, relay: tuple[str | None, str] = (None, ""),
                      chunk_bytes: int = 64 << 20) -> None:
        subscriber = None
        try:
            # Its sockets are used by this thread only. A version can only hold this model's tensors.
            subscriber = WeightSubscriber(endpoint, name=self.name, curve=curve,
                                          expected={n: shape for n, (_, shape) in self._expected_sent.items()},
                                          relay_host=relay[0], relay_advertise=relay[1], shm=True,
                                          max_chunk_bytes=chunk_frame_cap(chunk_bytes))
            ready.set()
            while not self._stop.is_set():
                weights = subscriber.poll(200)
                if weights is None:
                    continue
                future = asyncio.run_coroutine_threadsafe(self.apply_weights(weights), loop)
                try:
                    future.result()
                    subscriber.ack(weights.version, True)
                except Exception as exc:  # reported to the learner through the ack; the generator keeps serving
                    log.error("%s: weights version %d refused: %s", self.name, weights.version, exc)
                    subscriber.ack(weights.version, False, f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # the subscriber drops bad chunks itself: this is a bug, reported by health()
            self._weights_error = f"{self.name}: the weights thread died: {type(exc).__name__}: {exc}"
            log.critical(self._weights_error)
        finally:
            ready.set()
            if subscriber is not None:
                subscriber.close()
