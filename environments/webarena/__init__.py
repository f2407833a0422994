"""WebArena: `webarena_<n>` runs WebArena task config n in Chromium through Playwright's async API.

Ids 0-811 are WebArena's own tasks (libwebarena's configs; their sites are self-hosted images whose URLs come from
SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, WIKIPEDIA, HOMEPAGE); ids 812 and up are the local shop's tasks
(`python -m environments.webarena.shop`, or `local_site.local_site()` in tests). See tasks.py for sources and
splits, env.py for an episode, observation.py / actions.py / evaluators.py for the reference's formats.

| module | what it is |
|---|---|
| `tasks` | the task configs: libwebarena's 812 or a folder of them, plus the local shop's; splits, skips, sites |
| `env` | the WebArena env: a browser context per env, one action per step, the evaluators run on `stop` |
| `browser` | one Chromium per env worker (event loop), one context per env, a crashed browser replaced |
| `observation` | the accessibility-tree observation in the reference's format, with ids stable across contexts |
| `actions` | the action grammar: extraction from a reply, parsing, and execution in the browser |
| `evaluators` | WebArena's evaluators (string_match, url_match, program_html), run when the agent stops |
| `login` | saved login states: log in once through a site's form and save the browser's storage state |
| `local_site` | the local shop served for tests, benches and users, with its config and login state, in one context |
| `shop` | the local shop itself: a small store on 127.0.0.1 and its task configs (a package) |
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import re

from configs.env import WebArenaConfig
from core.env import Env, split_item_id
from environments.registry import Family
from environments.webarena.env import WebArenaEnv
from environments.webarena.tasks import (
    WEBARENA_TASKS, all_tasks, config_split_items, local_items, missing_sites, runnable_items, skipped_tasks,
    split_items,
)

_CLICKABLE = re.compile(r"\[(\d+)\] (?:link|button) '")


def make_env(cfg: WebArenaConfig) -> Env:
    """One env: a context on its event loop's shared Chromium (launched on the first reset)."""
    return WebArenaEnv(cfg)


def scripted_reply(observation: str, rng: random.Random) -> str:
    """A plausible, well-formed reply: click a link or button in view, or scroll."""
    ids = _CLICKABLE.findall(observation)
    action = f"click [{rng.choice(ids)}]" if ids and rng.random() < 0.8 else f"scroll [{rng.choice(['down', 'up'])}]"
    return f"Let's think step by step. In summary, the next action I will perform is ```{action}```"


def local_site_fixture():
    """A context manager serving the local shop (SHOPPING set, login state saved); yields `.cfg` for its tasks."""
    from environments.webarena.local_site import local_site

    return local_site()


def preflight(cfg: WebArenaConfig, items: list[str]) -> list[str]:
    """What stops `items` from running here: the browser, the task configs, the sites' URLs, login states."""
    problems = []
    if not os.path.exists(cfg.chromium_path):
        problems.append(f"env.webarena.chromium_path: no browser at {cfg.chromium_path} "
                        "(Debian: apt-get install -y chromium; launch/install.sh does this)")
    if importlib.util.find_spec("playwright") is None:
        problems.append("the playwright package is not installed (launch/install.sh installs it)")
    try:
        tasks = all_tasks(cfg)
    except (OSError, ValueError) as exc:
        return problems + [str(exc)]
    served = ("SHOPPING",) if cfg.tasks == "local_shop" else ()
    missing = missing_sites(cfg, items, served)
    if missing:
        problems.append(
            f"of its {len(items)} tasks, some need environment variables that are not set: "
            f"{', '.join(f'{var} ({n} tasks)' for var, n in sorted(missing.items()))}. They are the URLs of the "
            "self-hosted WebArena sites (e.g. GITLAB=http://host:8023); set them, or train on the local shop "
            "with env.webarena.tasks=local_shop")
    needs_login = sorted({str(tasks[n].get("storage_state")) for n in (split_item_id(i)[1] for i in items)
                          if n in tasks and tasks[n].get("storage_state")})
    if needs_login and not cfg.storage_state_dir and cfg.tasks != "local_shop":
        problems.append(f"its tasks log in from saved states ({', '.join(needs_login)}): set "
                        "env.webarena.storage_state_dir (python -m environments.webarena.login writes them)")
    return problems


@contextlib.contextmanager
def contract_context(cfg):
    """The env contract test's hook: run against the local shop, with `cfg` as the base config."""
    from environments.webarena.local_site import local_site

    with local_site(base=cfg) as site:
        yield site.cfg


FAMILY = Family(
    name="webarena",
    make_env=make_env,
    num_items=WEBARENA_TASKS + len(local_items()),
    split_sizes={"train": len(split_items("train")), "test": len(split_items("test"))},
    reference_max_turns=15,
    extras={
        "scripted_reply": scripted_reply,
        "contract_items": ["webarena_812", "webarena_819"],  # local shop tasks: need local_site_fixture()
        "max_instances_per_actor": lambda cfg: cfg.max_contexts_per_actor,
        "split_items": split_items,
        "config_split_items": config_split_items,  # tasks=local_shop: the shop's tasks in both splits
        "select_items": runnable_items,  # tasks skipped under this config are never drawn
        "preflight": preflight,
        "skipped_items": skipped_tasks,  # cfg -> {item id: reason}; fuzzy_match tasks without a judge
        "local_site": local_site_fixture,
        "contract_context": contract_context,
    },
)
