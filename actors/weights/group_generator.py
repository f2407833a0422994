"""A generator replica's end of the weights group (transport.weights_sync=collective, actors.weights.group):
joining it, and taking part in each announced version and loading it in place, like the ZeroMQ channel's
`Generator.apply_weights`. Mixed into actors.generator.Generator, whose engine, gate and stats it uses.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from core.models import tensor_set_mismatch

log = logging.getLogger("agentgym.generator")


class WeightUpdateError(RuntimeError):
    """A weight version could not be applied; the message names the tensor or the step that failed."""


class CollectiveWeights:
    _group_thread: threading.Thread | None = None

    async def apply_collective(self, raw: bytes, ann, problem: str = "", mode: str | None = None) -> float:
        """Take part in one announced version of the weights group (actors.weights.group) and load it in
        place, like `apply_weights`. A set that does not fit the checkpoint is received and dropped (the group's
        other members wait on every broadcast), then refused with WeightUpdateError."""
        mode = mode or self.cfg.on_weight_update
        started = time.monotonic()
        aliases: list[list[str]] = []
        if ann is not None and not problem:
            shapes = dict(ann.tensors)
            shapes.update({alias: shapes[src] for alias, src in ann.aliases})
            if self._tied and "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes:
                aliases.append(["lm_head.weight", "model.embed_tokens.weight"])
                shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
            problem = tensor_set_mismatch(shapes, self._expected_sent)
            if problem:
                await self.engine.collective_rpc("agentgym_receive_weights", args=(raw, [], False, False))
        if problem:
            self.stats.update_failures += 1
            raise WeightUpdateError(f"{self.name}: weights version refused: {problem}")
        async with self._update_lock:
            await self._swap(ann.version, mode, "agentgym_receive_weights",
                             (raw, aliases, True, self.cfg.weights_load == "direct"), started, started)
        return self._applied(ann.version, mode, started)

    async def join_weights_group(self, endpoint: str, rank_offset: int, world_size: int,
                                 timeout_s: float = 300.0) -> None:
        """Receive weights through the weights group at `endpoint` (transport.weights_sync=collective) instead of
        the ZeroMQ channel: this replica's workers take ranks `rank_offset`, `rank_offset + 1`, ... of a group of
        `world_size`. Returns at once (a malformed endpoint is refused here); a background thread joins when
        learner rank 0 forms the group (its store answers only then, so waiting for it here would hold the
        learner, which forms the group after every replica has returned), then applies and acks every
        announced version. A join that fails later is reported by health()."""
        from actors.weights.group_subscriber import parse_endpoint

        parse_endpoint(endpoint)
        if self._group_thread is not None:
            raise RuntimeError(f"{self.name} already joined a weights group")
        self._group_thread = threading.Thread(target=self._collective_loop,
                                              args=(endpoint, rank_offset, world_size, timeout_s,
                                                    asyncio.get_running_loop()),
                                              name=f"{self.name}-weights-group", daemon=True)
        self._group_thread.start()

    def _collective_loop(self, endpoint: str, rank_offset: int, world_size: int, timeout_s: float,
                         loop: asyncio.AbstractEventLoop) -> None:
        from actors.weights.group_subscriber import CollectiveSubscriber

        try:
            sub = CollectiveSubscriber(endpoint, self.name, timeout_s)
            join = self.engine.collective_rpc("agentgym_join_weights_group",
                                              args=(sub.host, sub.port, rank_offset, world_size, timeout_s))
            asyncio.run_coroutine_threadsafe(join, loop).result()
            while not self._stop.is_set():
                item = sub.next(self._stop.is_set)
                if item is None:
                    break
                seq, raw, ann, problem = item
                future = asyncio.run_coroutine_threadsafe(self.apply_collective(raw, ann, problem), loop)
                try:
                    future.result()
                    sub.ack(seq, True)
                except Exception as exc:  # reported to the learner through the ack
                    log.error("%s: weights announcement %d refused: %s", self.name, seq, exc)
                    sub.ack(seq, False, f"{type(exc).__name__}: {exc}")
                    if "WeightsGroupError" in f"{type(exc).__name__}: {exc}":  # the group cannot carry another
                        self._weights_error = f"{self.name}: the weights group failed: {exc}"[:2000]
        except BaseException as exc:  # a broken group is not survivable here: health() reports it
            self._weights_error = f"{self.name}: the weights group thread died: {type(exc).__name__}: {exc}"
            log.critical(self._weights_error)
