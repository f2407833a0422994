"""The environment interface every family implements: reset by item id, step with raw agent text, close.

What must hold:
- `reset(item_id)` is deterministic: the same item id gives a byte-identical first observation in any process.
- `step(text)` takes the agent's whole reply. The env extracts the action itself (its parse mode decides how)
  and reports whether one was found and accepted (`valid_action`) and by which rule (`parse_rule`). Bad agent
  output is never an exception: it gets an explanatory observation, changes nothing, and the episode goes on.
- `valid_action` is None only when the env cannot tell whether its action was accepted (a remote server that
  gives no verdict): such a turn earns no format reward and is left out of the valid-action fraction. Every
  built-in family always knows (True or False); a reply without an action is always False.
- An exception out of `reset` or `step` means the env itself is broken. The env pool closes it, replaces it,
  and ends the episode with reason `env_error`; it is never turned into a zero reward.
- One env instance serves one episode at a time and is reused across episodes (reset switches the task).

Blocking envs implement `SyncEnv` and are wrapped by `run_sync_env`, which moves every call onto one
dedicated worker thread (some simulators must never be touched from two threads), unless the env says its
calls are short CPU work that cannot hang (`SyncEnv.inline`): those run on the event loop itself.
"""
from __future__ import annotations

import abc
import asyncio
import concurrent.futures
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Observation:
    """What reset returns: the task's instruction and the first observation."""

    text: str  # the first observation, task description included
    instruction: str = ""  # how to act: action grammar and output format (system prompt or first user turn)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    valid_action: bool | None  # an action was found and the env accepted it; None: the env cannot tell
    parse_rule: str  # which rule found the action: "strict", "lenient", "exact" (the whole reply), or "none"
    success: bool = False  # the task was solved (meaningful once done)
    score: float | None = None  # the env's own raw score where it has one (e.g. SciWorld 0-100)
    # False: the action was accepted but changed nothing in the world (BabyAI's `check available actions`, a
    # `go to` of the object already faced); the format reward does not pay for it. None: the env cannot tell.
    changed: bool | None = None
    # True: the action took the world back to a state this episode was already in (a `pickup` then a `drop` of
    # one object, a turn left then right); the format reward pays it only if rollout.format_reward_revisits.
    # None: the env cannot tell (and an action that changed nothing is `changed=False`, not a revisit).
    revisited: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Env(abc.ABC):
    """An async text environment. Implementations set `family`."""

    family: str = ""

    @abc.abstractmethod
    async def reset(self, item_id: str) -> Observation: ...

    @abc.abstractmethod
    async def step(self, text: str) -> StepResult: ...

    async def close(self) -> None:
        return None

    def kill(self) -> None:
        """Release by force what this env holds outside this process (a JVM, a browser), from any thread and
        without waiting for a call that hangs: the pool's last resort when `close` times out."""
        return None


class SyncEnv(abc.ABC):
    """A blocking environment; wrap it with `run_sync_env` to use it as an `Env`."""

    family: str = ""
    # True for an env whose calls are a millisecond or so of pure computation on its own state (no I/O, no other
    # process, nothing that can hang): it then runs on the caller's event loop. A worker thread would add a
    # hand-off and a fight for the GIL to every step (BabyAI in a pool of 8 slots: 490 against 710-770 steps/s)
    # and buys nothing: such a step holds the GIL throughout anyway. Step timeouts cannot interrupt it.
    inline: bool = False

    @abc.abstractmethod
    def reset(self, item_id: str) -> Observation: ...

    @abc.abstractmethod
    def step(self, text: str) -> StepResult: ...

    def close(self) -> None:
        return None

    def kill(self) -> None:
        """As `Env.kill`; called from another thread while a call of this env may hang."""
        return None


class ThreadedEnv(Env):
    """Runs a `SyncEnv` on its own single worker thread, off the event loop."""

    def __init__(self, inner: SyncEnv):
        self.inner = inner
        self.family = inner.family
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"env-{inner.family}")

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def reset(self, item_id: str) -> Observation:
        return await self._call(self.inner.reset, item_id)

    async def step(self, text: str) -> StepResult:
        return await self._call(self.inner.step, text)

    async def close(self) -> None:
        try:
            await self._call(self.inner.close)
        finally:
            # A hung call keeps its thread; don't wait for it, the pool replaces this env anyway.
            self._pool.shutdown(wait=False, cancel_futures=True)


    def kill(self) -> None:
        self.inner.kill()


async def close_or_kill(env: Env, timeout_s: float) -> str:
    """Close `env` within `timeout_s`; past it (or when close fails) kill what it holds. Returns "closed",
    "killed" (close timed out or failed, the kill went through) or "failed: <why>" (the kill raised too)."""
    try:
        await asyncio.wait_for(env.close(), timeout_s)
        return "closed"
    except Exception as exc:  # noqa: BLE001 - a hung or broken env; it is out of the pool either way
        problem = f"{type(exc).__name__}: {exc}"
    try:
        env.kill()
    except Exception as exc:  # noqa: BLE001
        return f"failed: close {problem}; kill {type(exc).__name__}: {exc}"
    return "killed"


class InlineEnv(Env):
    """Runs a `SyncEnv` whose `inline` is True on the event loop (see `SyncEnv.inline`)."""

    def __init__(self, inner: SyncEnv):
        self.inner = inner
        self.family = inner.family

    async def reset(self, item_id: str) -> Observation:
        return self.inner.reset(item_id)

    async def step(self, text: str) -> StepResult:
        return self.inner.step(text)

    async def close(self) -> None:
        self.inner.close()

    def kill(self) -> None:
        self.inner.kill()


def run_sync_env(inner: SyncEnv) -> Env:
    return InlineEnv(inner) if inner.inline else ThreadedEnv(inner)


def split_item_id(item_id: str) -> tuple[str, int]:
    """`babyai_12` -> ("babyai", 12). Raises ValueError naming the bad id."""
    family, sep, index = item_id.rpartition("_")
    if not sep or not family or not index.isdigit():
        raise ValueError(f"item id {item_id!r} is not of the form <env>_<n>")
    return family, int(index)
