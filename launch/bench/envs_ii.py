"""Benchmark of the SciWorld, Search and WebArena envs: step latency and memory per instance.

    python -m launch.bench envs_ii [--sciworld-items 3] [--search-queries 200] [--webarena-rounds 3] [--only ...]

- SciWorld: the lean step (simulator step, score, completed flag and move count) against the package's stock
  `ScienceWorldEnv.step` (which also lists every valid action each call), side by side on the same gold action
  sequences, both JVMs with the same small heap. Memory: the JVM's proportional set size (PSS) after the episodes.
- Search: one `<search>` turn on the offline BM25 index (gold-title queries of generated items). Memory: the
  process's growth per extra env (envs share the process's retriever), with the retriever's one-off cost apart.
- WebArena: one env step on the local shop (action, settling, accessibility-tree observation). Memory: the
  browser's PSS growth per extra context (one context per env), with the browser's own cost apart.

`measure(args)` returns (rows for `HEADERS`, figures) so the envs benchmark can merge them into its table and JSON
line; `main` prints them itself. Timings on a shared machine are noisy: compare the side-by-side ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, fields

HEADERS = ("env", "measure", "p50 ms", "p90 ms", "samples", "MB per instance", "note")
FAMILIES = ("sciworld", "searchqa", "webarena")


@dataclass
class Options:
    sciworld_items: int = 3  # gold-path episodes per SciWorld variant
    search_queries: int = 200
    search_envs: int = 50  # extra envs created to measure per-env memory
    webarena_rounds: int = 3  # rounds of the scripted shop tasks
    webarena_contexts: int = 4  # contexts opened to measure per-context memory
    only: tuple[str, ...] = FAMILIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Options()
    parser.add_argument("--sciworld-items", type=int, default=defaults.sciworld_items)
    parser.add_argument("--search-queries", type=int, default=defaults.search_queries)
    parser.add_argument("--search-envs", type=int, default=defaults.search_envs)
    parser.add_argument("--webarena-rounds", type=int, default=defaults.webarena_rounds)
    parser.add_argument("--webarena-contexts", type=int, default=defaults.webarena_contexts)
    parser.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES))


def _options(args) -> Options:
    """Options from an argparse namespace that may come from another benchmark's parser (missing ones default)."""
    given = {f.name: getattr(args, f.name) for f in fields(Options) if hasattr(args, f.name)}
    if "only" in given:
        given["only"] = tuple(given["only"])
    return Options(**given)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _mb(pid: int) -> float:
    """Proportional set size of a process in MB (shared pages split among their users); RSS where PSS is absent."""
    import psutil

    proc = psutil.Process(pid)
    try:
        return proc.memory_full_info().pss / 2**20
    except (psutil.AccessDenied, AttributeError):
        return proc.memory_info().rss / 2**20


def _tree_mb(pid: int) -> float:
    import psutil

    procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    return sum(_mb(p.pid) for p in procs if p.is_running())


# ---- SciWorld ----------------------------------------------------------------------------------------------------
def _sciworld(opts: Options) -> tuple[list, dict]:
    from scienceworld import ScienceWorldEnv

    from configs.env import SciWorldConfig
    from environments.sciworld.env import SciWorldEnv
    from environments.sciworld.simulator import jvm_options
    from environments.sciworld.tasks import KEPT_TASKS, task_to_item

    cfg = SciWorldConfig()
    tasks = [KEPT_TASKS[k * 7 % len(KEPT_TASKS)] for k in range(opts.sciworld_items)]
    plans: list[tuple[str, int, list[str]]] = []
    lean_ms: list[float] = []
    env = SciWorldEnv(cfg, plan_gold=True)
    try:
        for task in tasks:
            env.reset(task_to_item(task.name, 0))
            gold = env.gold_actions()
            plans.append((task.name, 0, gold))
            for command in gold:
                t = time.perf_counter()
                result = env.step(f"Action: {command}")
                lean_ms.append((time.perf_counter() - t) * 1000)
                if result.done:
                    break
        jvm_mb = _mb(env.sim.pid)
    finally:
        env.close()

    # The stock wrapper starts its JVM through py4j without JVM options: pass the same small heap the lean env uses.
    saved = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(jvm_options(cfg.jvm_heap_mb))
    stock = ScienceWorldEnv("", envStepLimit=10_000)
    stock_ms: list[float] = []
    try:
        for name, variation, gold in plans:
            stock.load(name, variation, cfg.simplifications)
            stock.reset()
            for command in gold:
                t = time.perf_counter()
                _, _, done, _ = stock.step(command)
                stock_ms.append((time.perf_counter() - t) * 1000)
                if done:
                    break
    finally:
        stock.close()
        if saved is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = saved
    lean, stock50 = _pct(lean_ms, 0.5), _pct(stock_ms, 0.5)
    rows = [("sciworld", "lean step", lean, _pct(lean_ms, 0.9), len(lean_ms), jvm_mb, f"JVM -Xmx{cfg.jvm_heap_mb}m"),
            ("sciworld", "stock step", stock50, _pct(stock_ms, 0.9), len(stock_ms), float("nan"),
             f"stock/lean p50 = {stock50 / lean:.1f}x")]
    figures = {"sciworld_step_ms_p50": lean, "sciworld_stock_step_ms_p50": stock50,
               "sciworld_stock_over_lean": stock50 / lean, "sciworld_mb_per_instance": jvm_mb}
    return rows, figures


# ---- Search ------------------------------------------------------------------------------------------------------
def _search(opts: Options) -> tuple[list, dict]:
    from configs.env import SearchConfig
    from environments.searchqa.dataset import shared_data
    from environments.searchqa.env import SearchEnv

    cfg = SearchConfig()
    base = _mb(os.getpid())
    data = shared_data(cfg)  # builds (first time) or loads the corpus, index and QA set
    shared = _mb(os.getpid()) - base
    env = SearchEnv(cfg)
    rng = random.Random(0)
    latencies: list[float] = []
    while len(latencies) < opts.search_queries:
        item = f"searchqa_{rng.randrange(len(data.records))}"
        env.reset(item)
        for title in env._record.gold_titles:
            t = time.perf_counter()
            env.step(f"<search> {title} </search>")
            latencies.append((time.perf_counter() - t) * 1000)
    per_env = asyncio.run(_search_env_growth(cfg, opts.search_envs))
    rows = [("searchqa", "search turn (BM25)", _pct(latencies, 0.5), _pct(latencies, 0.9), len(latencies), per_env,
             f"shared retriever {shared:.0f} MB per process, {len(data.retriever.passages)} passages")]
    figures = {"search_query_ms_p50": _pct(latencies, 0.5), "search_mb_per_instance": per_env,
               "search_mb_per_process": shared}
    return rows, figures


async def _search_env_growth(cfg, count: int) -> float:
    """MB the process grows per extra env made as the pool makes them (each with its worker thread)."""
    from environments.registry import get_family

    family = get_family("searchqa")
    before = _mb(os.getpid())
    envs = [family.make_env(cfg) for _ in range(count)]
    for k, env in enumerate(envs):
        await env.reset(f"searchqa_{k}")
    grown = (_mb(os.getpid()) - before) / max(1, count)
    for env in envs:
        await env.close()
    return grown


# ---- WebArena ----------------------------------------------------------------------------------------------------
async def _webarena_async(opts: Options, site) -> tuple[list, dict]:
    from environments.webarena.env import WebArenaEnv
    from environments.webarena.shop.solutions import SOLUTIONS, ScriptedAgent
    from environments.webarena.tasks import skipped_tasks

    skipped = skipped_tasks(site.cfg)
    env = WebArenaEnv(site.cfg)
    step_ms: list[float] = []
    try:
        for _ in range(opts.webarena_rounds):
            for task_id, steps in SOLUTIONS.items():
                if f"webarena_{task_id}" in skipped:
                    continue
                site.shop.reset()
                obs = await env.reset(f"webarena_{task_id}")
                agent, text = ScriptedAgent(steps), obs.text
                for step in steps:
                    reply = agent(text)
                    t = time.perf_counter()
                    result = await env.step(reply)
                    if step.action != "stop":  # stop runs the evaluators, not a browser step
                        step_ms.append((time.perf_counter() - t) * 1000)
                    text = result.observation
        pid = env.host.browser_pid()
        one = _tree_mb(pid)
        others = [WebArenaEnv(site.cfg) for _ in range(opts.webarena_contexts - 1)]
        for other in others:
            await other.reset("webarena_812")
        many = _tree_mb(pid)
        for other in others:
            await other.close()
    finally:
        await env.close()
    per_context = (many - one) / max(1, opts.webarena_contexts - 1)
    rows = [("webarena", "step on local shop", _pct(step_ms, 0.5), _pct(step_ms, 0.9), len(step_ms), per_context,
             f"browser with 1 context {one:.0f} MB")]
    figures = {"webarena_step_ms_p50": _pct(step_ms, 0.5), "webarena_mb_per_instance": per_context,
               "webarena_browser_mb": one}
    return rows, figures


def _webarena(opts: Options) -> tuple[list, dict]:
    from configs.env import WebArenaConfig
    from environments.webarena.local_site import local_site

    if not os.path.exists(WebArenaConfig().chromium_path):
        return [("webarena", "skipped", float("nan"), float("nan"), 0, float("nan"),
                 f"no browser at {WebArenaConfig().chromium_path}")], {}
    with local_site() as site:
        return asyncio.run(_webarena_async(opts, site))


def measure(args) -> tuple[list[tuple], dict[str, float]]:
    """Rows (matching HEADERS) and figures for the families in `args.only` (all by default)."""
    opts = _options(args)
    rows: list[tuple] = []
    figures: dict[str, float] = {}
    for name, fn in (("sciworld", _sciworld), ("searchqa", _search), ("webarena", _webarena)):
        if name in opts.only:
            print(f"envs_ii: measuring {name} ...", file=sys.stderr, flush=True)
            r, f = fn(opts)
            rows += r
            figures.update(f)
    return rows, figures


def main(argv: list[str]) -> int:
    from launch.bench.report import emit, table

    parser = argparse.ArgumentParser(prog="python -m launch.bench envs_ii", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    rows, figures = measure(parser.parse_args(argv))
    print(table(HEADERS, rows))
    emit(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
