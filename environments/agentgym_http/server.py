"""Serving our envs over the AgentGym env-server protocol (see protocol.py), so AgentGym's own clients, or
our client, can use them.

What must hold:
- One server serves one family and holds many envs, each with its id; requests for one id are serialised.
- `/step` takes the extracted action the reference clients send; it is handed to the env as the reply
  "Action:\n<action>" (a text that already holds "Action:" is passed unchanged), so the env's own parser and
  explanations apply.
- Errors are HTTP 4xx for the client's faults (400: unknown id, step before reset, a body that is not UTF-8
  or not a JSON object, nested past `MAX_JSON_DEPTH`, numbers out of range, an id that is neither an integer
  nor a string of at most `MAX_ID_DIGITS` ASCII digits; 413: a body over
  `MAX_BODY_BYTES`; 429: `max_envs` envs already open) and 500 only when the env itself raised, always with
  {"error": ...}: clients of the reference assert status 200, so they fail loudly too.
- At most `max_envs` envs exist at once (each SciWorld env is a JVM): `/create` past that is refused.
- It binds 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from typing import Any, Callable

from aiohttp import web

from core.env import Env
from environments.agentgym_http.protocol import CLOSE, CREATE, OBSERVATION, RESET, STEP
from environments.parsing import MARKER

log = logging.getLogger("agentgym.env_server")


MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
MAX_INDEX = (1 << 31) - 1
MAX_ID_DIGITS = 18  # an id given as a string: ASCII digits, at most this many


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def default_max_envs(family: str) -> int:
    """Envs one server holds at most by default, from this machine's memory: a SciWorld env is a JVM
    (about 512 MiB with its heap), the others a few MiB (64 MiB allowed each)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 8 << 30
    per_env = (512 << 20) if family == "sciworld" else (64 << 20)
    return max(4, memory // per_env)


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, stopping at `limit` + 1 (iterative: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]
    return deepest


class EnvServer:
    def __init__(self, family: str, make: Callable[[], Env], max_envs: int | None = None):
        self.family = family
        self.max_envs = max_envs or default_max_envs(family)
        self._make = make
        self._envs: dict[int, Env] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._observations: dict[int, str] = {}
        self._scores: dict[int, float] = {}
        self._reset_done: set[int] = set()
        self._next_id = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/", self._hello)
        app.router.add_post(CREATE, self._wrap(self._create))
        app.router.add_post(RESET, self._wrap(self._reset))
        app.router.add_post(STEP, self._wrap(self._step))
        app.router.add_post(CLOSE, self._wrap(self._close))
        app.router.add_get(OBSERVATION, self._wrap(self._observation))
        app.on_cleanup.append(self._close_all)
        return app

    def _wrap(self, handler):
        async def run(request: web.Request) -> web.Response:
            try:
                return web.json_response(await handler(request))
            except BadRequest as exc:
                return web.json_response({"error": str(exc)}, status=exc.status)
            except web.HTTPRequestEntityTooLarge:
                return web.json_response({"error": f"request bodies are limited to {MAX_BODY_BYTES} bytes"},
                                         status=413)
            except Exception as exc:  # the env itself failed: report it, never a silent zero
                log.exception("%s %s failed", request.method, request.path)
                return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
        return run

    async def _hello(self, request: web.Request) -> web.Response:
        return web.json_response(f"This is environment {self.family}, served by agentgym-rl.")

    # -- helpers ------------------------------------------------------------------------------------------
    @staticmethod
    async def _body(request: web.Request) -> dict:
        raw = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge, answered 413
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("request body is not UTF-8") from None
        if not text.strip():
            return {}
        try:
            body = json.loads(text)
        except (ValueError, RecursionError):  # ValueError also covers integers of over 4,300 digits
            raise BadRequest("request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        if _depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
            raise BadRequest(f"request body is nested deeper than {MAX_JSON_DEPTH}")
        return body

    def _id(self, value: Any) -> int:
        # ASCII digits only: str.isdigit and int() also take other scripts' digits ("١" is 1 to int) and
        # superscripts ("²" passes isdigit, then int() raises), so neither may decide what an id is.
        if isinstance(value, str) and 0 < len(value) <= MAX_ID_DIGITS and value.isascii() and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadRequest(f"id {value!r:.40} is not an integer (ASCII digits, at most {MAX_ID_DIGITS})")
        env_id = value
        if env_id not in self._envs:
            raise BadRequest(f"The id {env_id} is not valid.")
        return env_id

    # -- endpoints ----------------------------------------------------------------------------------------
    async def _create(self, request: web.Request) -> dict:
        await self._body(request)  # TextCraft's clients send {"commands", "goal"}: accepted, unused
        if len(self._envs) >= self.max_envs:
            raise BadRequest(f"{self.max_envs} envs are open, the most this server holds (--max-envs); "
                             "close one first", status=429)
        env_id = self._next_id
        self._next_id += 1
        self._envs[env_id] = self._make()
        self._locks[env_id] = asyncio.Lock()
        self._observations[env_id] = ""
        return {"id": env_id}

    async def _reset(self, request: web.Request) -> dict:
        body = await self._body(request)
        env_id = self._id(body.get("id"))
        index = body.get("data_idx", 0)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= MAX_INDEX:
            raise BadRequest(f"data_idx {index!r:.40} is not an integer in [0, {MAX_INDEX}]")
        async with self._locks[env_id]:
            obs = await self._envs[env_id].reset(f"{self.family}_{index}")
            self._observations[env_id] = obs.text
            self._scores[env_id] = 0.0
            self._reset_done.add(env_id)
        return {"id": env_id, "observation": obs.text, "instruction": obs.instruction, "reward": 0.0,
                "score": 0.0, "done": False}

    async def _step(self, request: web.Request) -> dict:
        body = await self._body(request)
        env_id = self._id(body.get("id"))
        action = body.get("action")
        if not isinstance(action, str):
            raise BadRequest("action must be a string")
        if env_id not in self._reset_done:
            raise BadRequest(f"env {env_id} has not been reset")
        reply = action if MARKER in action else f"{MARKER}\n{action}"
        async with self._locks[env_id]:
            result = await self._envs[env_id].step(reply)
            self._observations[env_id] = result.observation
            self._scores[env_id] += float(result.reward)
            if result.done:
                self._reset_done.discard(env_id)
        return {"observation": result.observation, "reward": float(result.reward), "score": self._scores[env_id],
                "done": bool(result.done), "valid_action": bool(result.valid_action),
                "parse_rule": result.parse_rule, "success": bool(result.success)}

    async def _close(self, request: web.Request) -> dict:
        body = await self._body(request)
        env_id = self._id(body.get("id"))
        async with self._locks[env_id]:
            env = self._envs.pop(env_id)
            self._observations.pop(env_id, None)
            self._reset_done.discard(env_id)
            await env.close()
        self._locks.pop(env_id, None)
        return {"id": env_id, "closed": True}

    async def _observation(self, request: web.Request) -> str:
        return self._observations[self._id(request.query.get("id"))]

    async def _close_all(self, app: web.Application) -> None:
        for env in list(self._envs.values()):
            try:
                await env.close()
            except Exception as exc:
                log.warning("closing an env failed: %r", exc)
        self._envs.clear()


class ServerThread:
    """Runs an EnvServer on its own event loop in a background thread (tests, the contract hook)."""

    def __init__(self, server: EnvServer, host: str = "127.0.0.1", port: int = 0):
        self.server, self.host, self.port = server, host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="env-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ServerThread":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.server.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the bound port when 0 was asked for

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
