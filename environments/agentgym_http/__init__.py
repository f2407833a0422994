"""A client of AgentGym's HTTP env servers as one more env family, and the server that serves ours.

Item ids are `agentgym_http_<n>` (or the served task's own `<task>_<n>` ids from its dataset files), where n is
the server's data_idx; environments.item_sampler.family_of says which ids the env pool routes here.

| module | what it is |
|---|---|
| `protocol` | the HTTP protocol of AgentGym's env servers (create, reset, step, close, observation), `EnvServerError` |
| `client` | the client env: the action extracted from the reply, sent to the server, every failure raised |
| `verdicts` | whether an AgentGym server accepted an action, read from its fixed reply texts (BabyAI, TextCraft) |
| `server` | our families served over the same protocol, for AgentGym's clients or ours; loopback by default |
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
from typing import Any, Iterator

from core.env import Env
from environments.agentgym_http.client import AgentGymHTTPEnv
from environments.registry import Family


def make_env(cfg: Any) -> Env:
    """A client from `env.agentgym_http` (a configs.env.HTTPEnvConfig)."""
    return AgentGymHTTPEnv(cfg.url, cfg.task, cfg.timeout_s, cfg.parse_mode)


def make_server(family: str, env_cfg: Any, max_envs: int | None = None):
    """An EnvServer for our family `family`, each env built from the `env` config section; at most `max_envs`
    envs at once (None: sized to this machine's memory, server.default_max_envs)."""
    from environments.agentgym_http.server import EnvServer
    from environments.registry import make_env as make_ours

    return EnvServer(family, lambda: make_ours(family, env_cfg), max_envs=max_envs)


@contextlib.contextmanager
def contract_context(cfg: Any) -> Iterator[Any]:
    """For the env contract test: our BabyAI served on loopback, and this family's config pointing at it."""
    from configs.env import EnvConfig
    from environments.agentgym_http.server import ServerThread

    with ServerThread(make_server("babyai", EnvConfig())) as server:
        yield dataclasses.replace(cfg, url=server.url, task="babyai")


def _scripted_reply(text: str, rng: random.Random) -> str:
    from environments.babyai.scripted import scripted_reply

    return scripted_reply(text, rng)


FAMILY = Family(
    name="agentgym_http",
    make_env=make_env,
    num_items=0,  # defined by the server's dataset: splits come from env.data_dir
    split_sizes={},
    reference_max_turns=20,
    extras={
        "scripted_reply": _scripted_reply,
        "contract_items": ["agentgym_http_0", "agentgym_http_21"],
        "contract_context": contract_context,
    },
)
