"""A client of AgentGym's env servers (environments/agentgym_http/protocol.py) as one more env family.

What must hold:
- One server-side env per client: created on first reset, reset per item, closed on close. Item ids are
  `agentgym_http_<n>` or `<task>_<n>` (the served task's own ids): both reset data_idx n; any other prefix is
  refused (environments/item_sampler.family_of decides which ids reach this family).
- The client extracts the action from the agent's reply, as the reference's clients do: the `Action:` line
  rule for babyai and textcraft, the rest after the last `Action:` for other tasks (SciWorld's rule); in
  lenient mode BabyAI's available actions (read from the observation) and TextCraft's command grammar are
  also matched anywhere in the reply. A reply without an action is answered locally (no request), invalid.
- Every failure is an exception (EnvServerError): non-200 status, an "error" key, a malformed reply (a missing
  or mistyped field, a reward or score that is not a finite number), a reply over `max_reply_bytes` (refused
  while it is read, never held whole), a connection error, a timeout. The env pool turns it into `env_error`
  and replaces the env; nothing becomes a zero reward.
- `valid_action` is the server's own flag when it sends one (ours does); else the verdict its reply text
  gives for the task (verdicts.py: BabyAI's and TextCraft's known texts); else None, unknown: such a turn
  earns no format reward and is not counted in the valid-action fraction.
- The server's `score`, when it sends one (AgentGym's BabyAI does, TextCraft does not), is `StepResult.score`.
- `GET /observation` is answered with a string (TextCraft, ours) or an object with `observation`, `score`,
  `reward`, `done` (BabyAI): `observe()` reads both.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import aiohttp

from core.env import Env, Observation, StepResult, split_item_id
from environments.agentgym_http.protocol import (
    CLOSE,
    CREATE,
    OBSERVATION,
    RESET,
    STEP,
    EnvServerError,
    require,
)
from environments.agentgym_http.verdicts import action_validity
from environments.parsing import NONE, Parsed, last_named, parse_reply, strict_rest

LINE_RULE_TASKS = ("babyai", "textcraft")
# The largest reply the client reads: AgentGym's observations are a few KiB of text; past this a reply is
# refused (EnvServerError naming the cap) instead of held whole in memory.
MAX_REPLY_BYTES = 8 << 20


def _instruction(task: str) -> str:
    if task == "babyai":
        from environments.babyai.prompt import INSTRUCTION
        return INSTRUCTION
    if task == "textcraft":
        from environments.textcraft.prompt import INSTRUCTION
        return INSTRUCTION
    return ""


def _number(payload: dict, key: str, where: str, required: bool) -> float | None:
    """payload[key] as a finite float; None when it is absent (or null) and not required."""
    if payload.get(key) is None and not required:
        return None
    value = float(require(payload, key, (int, float), where))
    if not math.isfinite(value):
        raise EnvServerError(f"{where}: field {key!r} is not a finite number: {value!r}")
    return value


@dataclass(frozen=True)
class ServerObservation:
    """What `GET /observation` says: the text, and where the server sends them, its score, reward and done."""

    text: str
    score: float | None = None
    reward: float | None = None
    done: bool | None = None


class AgentGymHTTPEnv(Env):
    family = "agentgym_http"

    def __init__(self, url: str, task: str, timeout_s: float = 60.0, parse_mode: str = "strict",
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        if not url:
            raise ValueError("env.agentgym_http.url: give the base URL of the AgentGym env server")
        self.max_reply_bytes = max_reply_bytes
        self.url = url.rstrip("/")
        self.task = task
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.parse_mode = parse_mode
        self._session: aiohttp.ClientSession | None = None
        self.env_id: int | None = None
        self.observation = ""
        self._matcher = None

    # -- HTTP ---------------------------------------------------------------------------------------------
    async def _request(self, method: str, path: str, payload: dict | None = None,
                       params: dict | None = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        where = f"{method} {self.url}{path}"
        try:
            async with self._session.request(method, self.url + path, json=payload, params=params) as resp:
                status = resp.status
                raw = await self._read_capped(resp, where)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EnvServerError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise EnvServerError(f"{where}: HTTP {status}: {raw[:300].decode('utf-8', 'replace')}")
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is a ValueError too
            raise EnvServerError(f"{where}: reply is not UTF-8 JSON: {raw[:200]!r}") from None
        if isinstance(data, dict) and "error" in data:
            raise EnvServerError(f"{where}: server error: {data['error']}")
        return data

    async def _read_capped(self, resp: aiohttp.ClientResponse, where: str) -> bytes:
        """The reply's body, refused once it passes `max_reply_bytes` (by its declared length before reading,
        else while reading), so a server cannot make the client hold more than that."""
        cap = self.max_reply_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise EnvServerError(f"{where}: reply of {resp.content_length} bytes is over the client's cap of "
                                 f"{cap} bytes (max_reply_bytes)")
        parts, size = [], 0
        async for part in resp.content.iter_chunked(1 << 16):
            size += len(part)
            if size > cap:
                raise EnvServerError(f"{where}: reply is over the client's cap of {cap} bytes (max_reply_bytes)")
            parts.append(part)
        return b"".join(parts)

    # -- Env ----------------------------------------------------------------------------------------------
    async def reset(self, item_id: str) -> Observation:
        prefix, index = split_item_id(item_id)
        if prefix not in (self.family, self.task):
            raise ValueError(f"agentgym_http: item {item_id!r} is neither {self.family}_<n> nor "
                             f"{self.task or '<task>'}_<n> (env.agentgym_http.task)")
        if self.env_id is None:
            created = await self._request("POST", CREATE, {})
            self.env_id = int(require(created, "id", int, CREATE))
        data = await self._request("POST", RESET, {"id": self.env_id, "data_idx": index})
        self.observation = require(data, "observation", str, RESET)
        instruction = data.get("instruction")
        if not isinstance(instruction, str):  # reference servers keep the instruction client-side
            instruction = _instruction(self.task)
        return Observation(text=self.observation, instruction=instruction,
                           info={"server_id": self.env_id, "data_idx": index})

    async def step(self, text: str) -> StepResult:
        if self.env_id is None:
            raise RuntimeError("agentgym_http: step() before reset()")
        parsed = self._parse(text)
        if not parsed.found:
            return StepResult(parsed.error, 0.0, False, False, parsed.rule)
        data = await self._request("POST", STEP, {"id": self.env_id, "action": parsed.action})
        self.observation = require(data, "observation", str, STEP)
        reward = _number(data, "reward", STEP, required=True)
        done = bool(require(data, "done", bool, STEP))
        if "valid_action" in data:
            valid = bool(require(data, "valid_action", bool, STEP))
        else:  # AgentGym's servers send no flag: their reply text may tell, else it is unknown
            valid = action_validity(self.task, self.observation)
        success = bool(data.get("success", done and reward > 0))
        return StepResult(self.observation, reward, done, valid, parsed.rule, success=success,
                          score=_number(data, "score", STEP, required=False), info={"action": parsed.action})

    async def observe(self) -> ServerObservation:
        """The server's current observation, from either reply form of `GET /observation`."""
        if self.env_id is None:
            raise RuntimeError("agentgym_http: no env yet; reset() first")
        data = await self._request("GET", OBSERVATION, params={"id": str(self.env_id)})
        if isinstance(data, str):
            return ServerObservation(data)
        if not isinstance(data, dict):
            raise EnvServerError(f"GET {OBSERVATION}: expected a string or an object, got {data!r:.200}")
        done = data.get("done")
        if done is not None and not isinstance(done, bool):
            raise EnvServerError(f"GET {OBSERVATION}: field 'done' has type {type(done).__name__}")
        return ServerObservation(require(data, "observation", str, OBSERVATION),
                                 score=_number(data, "score", OBSERVATION, required=False),
                                 reward=_number(data, "reward", OBSERVATION, required=False), done=done)

    async def current_observation(self) -> str:
        return (await self.observe()).text

    async def close(self) -> None:
        try:
            if self.env_id is not None:
                try:
                    await self._request("POST", CLOSE, {"id": self.env_id})
                except EnvServerError as exc:
                    if "HTTP 404" not in str(exc):  # the reference BabyAI server has no /close
                        raise
        finally:
            self.env_id = None
            if self._session is not None:
                await self._session.close()
                self._session = None

    # -- parsing ------------------------------------------------------------------------------------------
    def _parse(self, reply: str) -> Parsed:
        if self.task not in LINE_RULE_TASKS:
            action = strict_rest(reply)
            if action is None:
                return Parsed(None, NONE, "No action found. End your reply with 'Action:' and your action.")
            return Parsed(action, "strict")
        accepts, find = (lambda a: True), (lambda r: None)
        if self.task == "babyai":
            from environments.babyai.scripted import available_actions

            names = {a: a for a in available_actions(self.observation)}
            names.update({"pick up " + a[7:]: a for a in list(names) if a.startswith("pickup ")})
            accepts = lambda a: " ".join(a.lower().split()).replace("pick up ", "pickup ") in names  # noqa: E731
            find = lambda r: names.get(last_named(r, names))  # noqa: E731
        elif self.task == "textcraft":
            from environments.textcraft.lenient import matcher_for
            from environments.textcraft.recipes import default_book

            accepts = lambda a: a.startswith(("get ", "craft ", "inventory"))  # noqa: E731
            find = matcher_for(default_book()).find
        return parse_reply(reply, self.parse_mode, accepts, find)
