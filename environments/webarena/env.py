"""The WebArena env: a browser context per env on its worker's shared Chromium, WebArena's task configs and evaluators.

Per episode: reset opens a fresh context (logged in from the task's saved storage state when it names one),
opens the start URL(s), and shows the accessibility-tree observation. Each step runs one action (actions.py);
`stop [answer]` ends the episode and runs the task's evaluators (evaluators.py): reward = success = their
product, 0 or 1. A malformed or impossible action is shown to the agent (PREVIOUS ACTION says what went wrong)
and changes nothing; a dead browser or context raises, which the pool treats as an env error.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from configs.env import WebArenaConfig
from core.env import Env, Observation, StepResult
from environments.webarena import actions, evaluators
from environments.webarena.browser import VIEWPORT, BrowserHost, host_for
from environments.webarena.observation import TreeNode, build_tree, format_observation
from environments.webarena.tasks import skipped_tasks, task_for

log = logging.getLogger(__name__)
_REPORTED: set[str] = set()
STALE_TREE_S = 2.0  # how long a tree named for the previous document is looked at again (observe_settled)

INSTRUCTION = """You are an autonomous agent operating a web browser to accomplish a task. Each turn shows the \
page's accessibility tree (elements as "[id] role 'name'"), the page URL, the objective and your previous \
action. Reply with your reasoning, then the next action inside triple backticks, e.g. "In summary, the next \
action I will perform is ```click [12]```". Actions:
click [id] | type [id] [text] [1 to press Enter after typing, 0 not to] | hover [id] | press [key combination] | \
scroll [down|up] | new_tab | tab_focus [tab index] | close_tab | goto [url] | go_back | go_forward | \
stop [answer] (issue this when done; put the answer in the brackets if the task asks for one, or N/A if the \
task is impossible).
Issue one action per turn, and only on elements shown in the current observation."""


def _playwright_error():
    from playwright.async_api import Error

    return Error


class BrowserSession:
    """One env's browser context, its current tab, that tab's CDP session and the last observed tree."""

    def __init__(self, context):
        self.context = context
        self.page = None
        self.cdp = None
        self.nodes: dict[str, TreeNode] = {}
        self.navigating = False  # a main-frame navigation was requested and its document has not loaded yet
        self.stale_tree = False  # the last tree's root was not named for the page's title (see observe_settled)
        context.on("request", self._on_request)
        context.on("requestfailed", self._on_request_done)
        context.on("requestfinished", self._on_request_finished)
        context.on("page", self._watch_page)

    def _watch_page(self, page) -> None:
        page.on("domcontentloaded", self._on_load)
        page.on("download", self._on_load)

    def _on_request(self, request) -> None:
        if request.is_navigation_request() and request.frame.parent_frame is None:
            self.navigating = True

    def _on_request_done(self, request) -> None:
        if request.is_navigation_request() and request.frame.parent_frame is None:
            self.navigating = False

    async def _on_request_finished(self, request) -> None:
        # A navigation answered without a document (204/205) never loads one: it is over when it finishes.
        if request.is_navigation_request() and request.frame.parent_frame is None:
            response = await request.response()
            if response is not None and response.status in (204, 205):
                self.navigating = False

    def _on_load(self, _page) -> None:
        self.navigating = False

    async def switch_to(self, page) -> None:
        if page is self.page and self.cdp is not None:
            return
        self.page = page
        self.cdp = await self.context.new_cdp_session(page)

    async def observe_settled(self, settle_ms: float, timeout_ms: float) -> tuple[str, str]:
        """Observe once the page is quiet: no main-frame navigation pending and the document not busy.

        A navigation an action starts is announced a moment later, possibly after the first look: the page is
        observed, then checked again (events announced before the observation's own answer have arrived by
        then), and observed again after the load if it turned out to be moving.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        await asyncio.sleep(settle_ms / 1000)
        # An accessibility tree still named for the previous document (its root's name is not the page's title,
        # seen under load right after a navigation) is looked at again, for at most STALE_TREE_S.
        stale_until = min(deadline, loop.time() + STALE_TREE_S)
        while True:
            while self.navigating and loop.time() < deadline:
                await asyncio.sleep(0.01)
            try:
                await self.page.wait_for_load_state("load", timeout=max(1.0, (deadline - loop.time()) * 1000))
            except _playwright_error():  # a slow page is observed as it is, as in the reference
                pass
            tabs, tree, busy = await self.observe()
            busy = busy or (self.stale_tree and loop.time() < stale_until)
            if (not self.navigating and not busy) or loop.time() >= deadline:
                self.navigating = False
                return tabs, tree
            await asyncio.sleep(0.02)

    async def observe(self) -> tuple[str, str, bool]:
        """(tabs line, tree text, whether the document is still loading); also refreshes `nodes`."""
        ax = (await self.cdp.send("Accessibility.getFullAXTree", {}))["nodes"]
        snapshot = await self.cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": []})
        tree, self.nodes = build_tree(ax, snapshot, VIEWPORT)
        busy = any(p.get("name") == "busy" and p.get("value", {}).get("value") for p in ax[0].get("properties") or []) \
            if ax else True
        titles, current = [], ""
        for i, tab in enumerate(self.context.pages):
            title = await tab.title()
            if tab is self.page:
                current = title
            titles.append(f"Tab {i} (current): {title}" if tab is self.page else f"Tab {i}: {title}")
        root = " ".join(str((ax[0].get("name") or {}).get("value", "")).split()) if ax else ""
        self.stale_tree = bool(ax) and root != " ".join(current.split())
        return " | ".join(titles), tree, busy

    async def close(self) -> None:
        try:
            await self.context.close()
        except _playwright_error():  # the browser is already gone
            pass


class WebArenaEnv(Env):
    family = "webarena"

    def __init__(self, cfg: WebArenaConfig):
        self.cfg = cfg
        self.host: BrowserHost | None = None
        self.session: BrowserSession | None = None
        self.task: dict | None = None
        self.judge = evaluators.Judge(cfg.judge_url, cfg.judge_model) if cfg.judge_url else None
        if not cfg.judge_url and cfg.task_dir not in _REPORTED:  # say once per process which tasks cannot run
            _REPORTED.add(cfg.task_dir)
            skipped = skipped_tasks(cfg)
            if skipped:
                log.warning("webarena: %d task(s) need a fuzzy_match judge and env.webarena.judge_url is empty; "
                            "they are skipped (reset refuses them): %s", len(skipped),
                            ", ".join(sorted(skipped, key=lambda i: int(i.split("_")[1]))))
        self._done = True
        self._previous = "None"

    def _storage_state(self, task: dict) -> str | None:
        name = task.get("storage_state")
        if not name:
            return None
        if not self.cfg.storage_state_dir:
            raise ValueError(f"task {task['task_id']} logs in from {name}: set env.webarena.storage_state_dir to "
                             "the folder of saved login states (python -m environments.webarena.login)")
        path = Path(self.cfg.storage_state_dir) / Path(name).name
        if not path.is_file():
            raise FileNotFoundError(f"task {task['task_id']} needs the login state {path} "
                                    "(python -m environments.webarena.login writes it)")
        return str(path)

    async def reset(self, item_id: str) -> Observation:
        task = task_for(item_id, self.cfg)
        storage = self._storage_state(task)
        if self.host is None:
            self.host = host_for(self.cfg.chromium_path)
            self.host.acquire()
        if self.session is not None:
            await self.session.close()
            self.session = None
        context = await self.host.new_context(storage, task.get("geolocation"))
        context.set_default_timeout(self.cfg.action_timeout_ms)
        self.session = BrowserSession(context)
        urls = [u.strip() for u in str(task["start_url"]).split(" |AND| ") if u.strip()]
        first = None
        for url in urls:
            page = await context.new_page()
            first = first or page
            await page.goto(url, wait_until="load", timeout=self.cfg.action_timeout_ms)
        await first.bring_to_front()
        await self.session.switch_to(first)
        self.session.navigating = False  # the start pages have loaded (goto waited for them)
        self.task = task
        self._done = False
        self._previous = "None"
        info = {"task_id": task["task_id"], "sites": task.get("sites", []), "eval_types": task["eval"]["eval_types"],
                "browser_restarts": self.host.restarts, "browser_launches": self.host.launches}
        return Observation(text=await self._observation(settle=True), instruction=INSTRUCTION, info=info)

    async def _observation(self, settle: bool = False) -> str:
        if settle:
            tabs, tree = await self.session.observe_settled(self.cfg.settle_ms, self.cfg.action_timeout_ms)
        else:
            tabs, tree, _ = await self.session.observe()
        return format_observation(tabs, tree, self.session.page.url, self.task["intent"], self._previous)

    def _alive(self) -> bool:
        return self.host is not None and self.host.connected() and self.session is not None and \
            self.session.page is not None and not self.session.page.is_closed()

    async def step(self, text: str) -> StepResult:
        if self._done or self.session is None:
            raise RuntimeError("WebArenaEnv.step called with no episode running; call reset first")
        action_str, rule = actions.extract(text, self.cfg.parse_mode)
        if action_str is None:
            return await self._rejected("no action found: put one action inside triple backticks", "none")
        try:
            action = actions.parse(action_str)
        except actions.ActionError as e:
            return await self._rejected(str(e), rule)
        if action.kind == "stop":
            return await self._finish(action, rule)
        self.session.navigating = False  # only navigations this action starts count
        try:
            await actions.execute(action, self.session)
        except actions.ActionError as e:
            return await self._rejected(str(e), rule)
        except _playwright_error() as e:
            if not self._alive():
                raise  # the browser or the tab died: an env error, the pool replaces this env
            return await self._rejected(f"{action} failed: {str(e).splitlines()[0]}", rule)
        if self.session.page.is_closed():
            raise RuntimeError("the current tab closed itself")
        self._previous = str(action)
        return StepResult(observation=await self._observation(settle=True), reward=0.0, done=False, valid_action=True,
                          parse_rule=rule, info={"url": self.session.page.url})

    async def _rejected(self, reason: str, rule: str) -> StepResult:
        self._previous = f"invalid action ({reason})"
        return StepResult(observation=await self._observation(), reward=0.0, done=False, valid_action=False,
                          parse_rule=rule)

    async def _finish(self, action: actions.Action, rule: str) -> StepResult:
        self._done = True
        score, parts = await evaluators.evaluate(self.task, action.argument, self.session.page, self.judge,
                                                 self.cfg.action_timeout_ms)
        return StepResult(observation=f"The episode is over (score {score:g}).", reward=score, done=True,
                          valid_action=True, parse_rule=rule, success=score == 1.0, score=score,
                          info={"eval": parts, "answer": action.argument, "url": self.session.page.url})

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.host is not None:
            host, self.host = self.host, None
            await host.release()

    def kill(self) -> None:
        """A close that hangs means the worker's browser stopped answering: kill its process. The other envs on it
        fail their next call and are replaced by the pool, and the next context starts a fresh browser (counted in
        `browser_restarts`), as after a crash."""
        pid = self.host.browser_pid() if self.host is not None else None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
