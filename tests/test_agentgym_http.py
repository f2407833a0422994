"""The AgentGym env-server protocol: our client against our server on loopback, a reference-style client,
and errors surfacing as errors."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from aiohttp import web

from configs.env import EnvConfig
from environments.agentgym_http import make_server
from environments.agentgym_http.client import AgentGymHTTPEnv
from environments.agentgym_http.protocol import EnvServerError
from environments.agentgym_http.server import EnvServer, ServerThread
from environments.babyai.env import BabyAIEnv
from environments.textcraft.planner import plan
from environments.textcraft.recipes import default_book


@pytest.fixture(scope="module")
def babyai_server():
    with ServerThread(make_server("babyai", EnvConfig())) as server:
        yield server


def test_round_trip_matches_the_local_env(babyai_server):
    actions = ["turn left", "go to grey key 1", "pick up grey key 1", "bogus action", "drop", "turn right"]
    local = BabyAIEnv(parse_mode="lenient")
    expected = [local.reset("babyai_0").text] + [local.step(f"Action:\n{a}") for a in actions]

    async def remote():
        env = AgentGymHTTPEnv(babyai_server.url, "babyai", timeout_s=30)
        try:
            obs = await env.reset("agentgym_http_0")
            steps = [await env.step(f"Thought:\nok\n\nAction:\n{a}") for a in actions]
            return obs, steps, await env.current_observation()
        finally:
            await env.close()

    obs, steps, current = asyncio.run(remote())
    assert obs.text == expected[0] and "Thought:" in obs.instruction
    for got, want in zip(steps, expected[1:]):
        assert got.observation == want.observation
        assert (got.reward, got.done, got.valid_action, got.success) == \
            (want.reward, want.done, want.valid_action, want.success)
    assert current == steps[-1].observation


def test_textcraft_goal_solved_over_http():
    with ServerThread(make_server("textcraft", EnvConfig())) as server:
        async def main():
            env = AgentGymHTTPEnv(server.url, "textcraft", timeout_s=30)
            try:
                obs = await env.reset("textcraft_540")
                results = [await env.step(f"Action:\n{a}") for a in plan(obs.text, default_book())]
            finally:
                await env.close()
            return results
        results = asyncio.run(main())
    assert all(r.valid_action for r in results) and results[-1].done and results[-1].reward == 1.0


def _post(url: str, path: str, body: dict | None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_reference_style_client_requests_work(babyai_server):
    """Requests shaped like AgentGym's BabyAI client: /create without a body, the extracted action in /step."""
    status, created = _post(babyai_server.url, "/create", None)
    assert status == 200 and isinstance(created["id"], int)
    status, reset = _post(babyai_server.url, "/reset", {"id": created["id"], "data_idx": 1})
    assert status == 200 and reset["observation"].startswith("Your goal: go to the red ball") and not reset["done"]
    status, step = _post(babyai_server.url, "/step", {"id": created["id"], "action": "go to red ball 1"})
    assert status == 200 and step["done"] and step["reward"] > 0 and step["score"] == step["reward"]
    status, error = _post(babyai_server.url, "/step", {"id": 10_000, "action": "turn left"})
    assert status == 400 and "not valid" in error["error"]
    assert _post(babyai_server.url, "/close", {"id": created["id"]})[0] == 200


def _reference_style_server(step_reply: dict) -> web.Application:
    """A stand-in for a reference AgentGym server (none can run here): it answers errors with HTTP 200 and an
    "error" key, and has no /close, as the reference BabyAI server does."""
    app = web.Application()

    async def create(request):
        return web.json_response({"id": 0})

    async def reset(request):
        return web.json_response({"observation": "Your goal: x\nAvailable actions: [\"turn left\"]",
                                  "reward": 0, "score": 0, "done": False})

    async def step(request):
        return web.json_response(step_reply)

    app.router.add_post("/create", create)
    app.router.add_post("/reset", reset)
    app.router.add_post("/step", step)
    return app


class _AppThread(ServerThread):
    def __init__(self, app: web.Application):
        super().__init__(EnvServer("none", lambda: None))
        self._app = app

    async def _start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, 0).start()
        self.port = self._runner.addresses[0][1]


@pytest.mark.parametrize("reply, match", [
    ({"error": "The task with environment 0 has finished."}, "server error: The task"),
    ({"observation": "ok", "done": False}, "no 'reward'"),
    ({"observation": 3, "reward": 0, "done": False}, "'observation' has type int"),
    ({"observation": "ok", "reward": 0, "done": False, "score": "high"}, "'score' has type str"),
    ({"observation": "ok", "reward": float("nan"), "done": False}, "'reward' is not a finite number"),
    ({"observation": "ok", "reward": 0, "done": False, "score": float("inf")}, "'score' is not a finite number"),
    ({"observation": "ok", "reward": 0, "done": False, "valid_action": "yes"}, "'valid_action' has type str"),
])
def test_server_errors_are_errors_never_zero_rewards(reply, match):
    with _AppThread(_reference_style_server(reply)) as server:
        async def main():
            env = AgentGymHTTPEnv(server.url, "babyai", timeout_s=10)
            try:
                await env.reset("agentgym_http_0")
                with pytest.raises(EnvServerError, match=match):
                    await env.step("Action: turn left")
            finally:
                await env.close()  # no /close on this server: the 404 is tolerated
        asyncio.run(main())


def test_env_failures_and_dead_servers_raise(babyai_server):
    class Exploding(BabyAIEnv):
        def step(self, reply):
            raise RuntimeError("simulator crashed")

    from core.env import run_sync_env
    with ServerThread(EnvServer("babyai", lambda: run_sync_env(Exploding()))) as server:
        url = server.url

        async def main():
            env = AgentGymHTTPEnv(url, "babyai", timeout_s=10)
            await env.reset("babyai_3")
            with pytest.raises(EnvServerError, match="HTTP 500.*simulator crashed"):
                await env.step("Action: turn left")
            await env.close()
        asyncio.run(main())

    async def dead():
        env = AgentGymHTTPEnv(url, "babyai", timeout_s=5)  # that server is stopped now
        with pytest.raises(EnvServerError, match="POST .*/create"):
            await env.reset("babyai_3")
        await env.close()
    asyncio.run(dead())


def test_replies_without_an_action_are_answered_locally(babyai_server):
    async def main():
        env = AgentGymHTTPEnv(babyai_server.url, "babyai", parse_mode="lenient")
        try:
            await env.reset("babyai_1")
            none = await env.step("I am not sure what to do.")
            named = await env.step("I think I should go to red ball 1 now")
        finally:
            await env.close()
        return none, named
    none, named = asyncio.run(main())
    assert not none.valid_action and none.parse_rule == "none" and "No available action" in none.observation
    assert named.parse_rule == "lenient" and named.success


def _flooding_server(declared: bool) -> web.Application:
    """A server whose /create reply never ends (streamed without a length) or declares 64 MiB: the client
    must refuse it at its cap instead of holding it whole."""
    app = web.Application()

    async def create(request):
        if declared:
            return web.Response(body=b" " * (64 << 20), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            for _ in range(4096):  # 4 GiB if nothing stopped it; the client hangs up at its cap
                await resp.write(b" " * (1 << 20))
        except (ConnectionError, RuntimeError):
            pass
        return resp

    app.router.add_post("/create", create)
    return app


@pytest.mark.parametrize("declared", [False, True])
def test_client_refuses_a_reply_over_its_cap_naming_it(declared):
    with _AppThread(_flooding_server(declared)) as server:
        async def main():
            env = AgentGymHTTPEnv(server.url, "babyai", timeout_s=30, max_reply_bytes=1 << 20)
            try:
                with pytest.raises(EnvServerError, match="over the client's cap of 1048576 bytes"):
                    await env.reset("agentgym_http_0")
            finally:
                await env.close()
        asyncio.run(main())
