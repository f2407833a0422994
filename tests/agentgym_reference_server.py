"""Test servers that answer like AgentGym's own env servers, which cannot run in the test suite here.

- `ReferenceStyleServer(family, style)`: our env server (real envs of ours behind it) answering in the reply
  format of AgentGym's BabyAI server (`style="babyai"`) or TextCraft server (`style="textcraft"`): no
  `valid_action`, `parse_rule`, `success` or `instruction`; BabyAI's `score` (a running sum of rewards) and
  its object form of `GET /observation`; TextCraft's string `GET /observation` and no score; `/close`
  answers `true`. The texts are our envs' own, so only the format is AgentGym's.
- `ReplayServer(exchanges)`: answers each request with the reply AgentGym's real server gave to the same
  request (tests/data/agentgym_reference_replies.json, recorded from those servers), in the recorded order;
  a request that differs from the recording is answered HTTP 409, naming both.
- `serve(family, style)`: one of these on 127.0.0.1 in a background thread, `style="agentgym-rl"` being our
  own format; tests choose the style they need.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

from aiohttp import web

from configs.env import EnvConfig
from environments.agentgym_http import make_server
from environments.agentgym_http.server import EnvServer, ServerThread
from environments.registry import make_env

RECORDED = Path(__file__).parent / "data" / "agentgym_reference_replies.json"
STYLES = ("agentgym-rl", "babyai", "textcraft")


def recorded_exchanges(task: str) -> list[dict]:
    """The recorded requests and replies of one episode on AgentGym's `task` server."""
    return json.loads(RECORDED.read_text())[task]


class ReferenceStyleServer(EnvServer):
    def __init__(self, family: str, style: str):
        if style not in ("babyai", "textcraft"):
            raise ValueError(f"style {style!r}: expected babyai or textcraft")
        super().__init__(family, lambda: make_env(family, EnvConfig()), max_envs=64)
        self.style = style
        self.requests: list[str] = []  # "METHOD /path" of every request, in order
        self._goal: dict[int, str] = {}
        self._last: dict[int, dict] = {}

    def _note(self, request: web.Request) -> None:
        self.requests.append(f"{request.method} {request.path}")

    async def _create(self, request: web.Request) -> dict:
        self._note(request)
        return await super()._create(request)

    async def _reset(self, request: web.Request) -> dict:
        self._note(request)
        ours = await super()._reset(request)
        env_id = ours["id"]
        self._goal[env_id] = ours["observation"].split("\n", 1)[0]
        self._last[env_id] = {"reward": 0, "done": False}
        if self.style == "babyai":
            return {"observation": ours["observation"], "reward": 0, "score": 0, "deleted": False,
                    "done": False}
        return {"id": env_id, "observation": ours["observation"], "done": False, "reward": 0}

    async def _step(self, request: web.Request) -> dict:
        self._note(request)
        env_id = self._id((await self._body(request)).get("id"))  # aiohttp keeps the body for the second read
        ours = await super()._step(request)
        self._last[env_id] = {"reward": ours["reward"], "done": ours["done"]}
        reply = {"observation": ours["observation"], "reward": ours["reward"], "done": ours["done"]}
        if self.style == "babyai":
            reply["score"] = ours["score"]
        return reply

    async def _observation(self, request: web.Request):
        self._note(request)
        text = await super()._observation(request)
        if self.style == "textcraft":
            return text
        env_id = self._id(request.query.get("id"))
        goal = self._goal.get(env_id, "")
        if goal and not text.startswith(goal):
            text = f"{goal}\n{text}"  # AgentGym's BabyAI puts the goal before the latest observation
        return {"observation": text, **self._last.get(env_id, {"reward": 0, "done": False}),
                "score": self._scores.get(env_id, 0.0), "deleted": False}

    async def _close(self, request: web.Request) -> bool:
        self._note(request)
        await super()._close(request)
        return True


class ReplayServer:
    def __init__(self, exchanges: list[dict]):
        self.exchanges = exchanges
        self.position = 0

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("/create", "/reset", "/step", "/close"):
            app.router.add_post(path, self._answer)
        app.router.add_get("/observation", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        raw = await request.read()
        got = {"method": request.method, "path": request.path_qs, "body": json.loads(raw) if raw else None}
        want = self.exchanges[self.position] if self.position < len(self.exchanges) else None
        if want is None or got != {k: want[k] for k in ("method", "path", "body")}:
            return web.json_response({"error": f"unexpected request {got}; recorded next: {want}"},
                                     status=409)
        self.position += 1
        return web.json_response(want["reply"])


@contextlib.contextmanager
def serve(family: str, style: str) -> Iterator[ServerThread]:
    """A server for our `family` in reply `style` (STYLES) on 127.0.0.1; `.server` is the server object."""
    if style not in STYLES:
        raise ValueError(f"style {style!r}: expected one of {STYLES}")
    if style == "agentgym-rl":
        server = make_server(family, EnvConfig())
    else:
        server = ReferenceStyleServer(family, style)
    with ServerThread(server) as thread:
        yield thread


@contextlib.contextmanager
def replay(task: str) -> Iterator[ServerThread]:
    """A ReplayServer of the recorded episode on AgentGym's `task` server, on 127.0.0.1."""
    with ServerThread(ReplayServer(recorded_exchanges(task))) as thread:  # type: ignore[arg-type]
        yield thread
