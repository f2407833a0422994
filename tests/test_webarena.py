"""WebArena on real Chromium against the local shop: observation, actions, evaluators, login, crash recovery."""
from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from configs.env import WebArenaConfig
from environments.registry import get_family
from environments.webarena import actions, evaluators
from environments.webarena.env import WebArenaEnv
from environments.webarena.local_site import local_site
from environments.webarena.login import save_login_state
from environments.webarena.shop.solutions import SOLUTIONS, WRONG_ENDINGS, ScriptedAgent, find_element
from environments.webarena.tasks import (SkippedTask, all_tasks, local_items, skipped_tasks, split_items,
                                         substitute, task_for)

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                reason="needs Debian's chromium (launch/install.sh installs it)")


@pytest.fixture(scope="module")
def run():
    """One event loop for the module, on a thread of its own, so every test shares one browser."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="webarena-tests", daemon=True)
    thread.start()
    yield lambda coro, timeout=180: asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.fixture(scope="module")
def site():
    with local_site() as s:
        yield s


@pytest.fixture(scope="module")
def env(run, site):
    e = WebArenaEnv(site.cfg)
    yield e
    host = e.host
    run(e.close())
    assert host is None or (not host.connected() and host.browser_pid() is None)  # the browser is gone


async def play(env: WebArenaEnv, item: str, steps) -> list:
    obs = await env.reset(item)
    agent, text, results = ScriptedAgent(steps), obs.text, []
    for _ in steps:
        result = await env.step(agent(text))
        results.append(result)
        text = result.observation
        if result.done:
            break
    return results


# ---- pure parts ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("click [12]", actions.Action("click", element_id="12")),
    ("hover [3]", actions.Action("hover", element_id="3")),
    ("type [7] [yoga mat] [0]", actions.Action("type", element_id="7", argument="yoga mat", enter=False)),
    ("type [7] [yoga [big] mat]", actions.Action("type", element_id="7", argument="yoga [big] mat", enter=True)),
    ("press [Control+a]", actions.Action("press", argument="Control+a")),
    ("scroll [down]", actions.Action("scroll", argument="down")),
    ("scroll up", actions.Action("scroll", argument="up")),
    ("new_tab", actions.Action("new_tab")), ("close_tab", actions.Action("close_tab")),
    ("tab_focus [1]", actions.Action("tab_focus", index=1)),
    ("goto [http://127.0.0.1:1/x]", actions.Action("goto", argument="http://127.0.0.1:1/x")),
    ("go_back", actions.Action("go_back")), ("go_forward", actions.Action("go_forward")),
    ("stop [$21.00]", actions.Action("stop", argument="$21.00")), ("stop", actions.Action("stop")),
])
def test_parse_every_action(text, expected):
    assert actions.parse(text) == expected
    assert actions.parse(str(expected)) == expected  # the printed form reads back


@pytest.mark.parametrize("bad", ["click [abc]", "type [3]", "fly [2]", "tab_focus []", "goto", ""])
def test_parse_rejects_malformed_actions(bad):
    with pytest.raises(actions.ActionError):
        actions.parse(bad)


def test_extract_strict_and_lenient():
    reply = "I see it. In summary, the next action I will perform is ```click [12]``` then ```stop [x]```"
    assert actions.extract(reply, "strict") == ("click [12]", "strict")
    assert actions.extract("I will click [12] now.\nclick [12]", "strict") == (None, "none")
    assert actions.extract("Thinking...\nAction: click [12]", "lenient") == ("click [12]", "lenient")
    assert actions.extract("nothing to do", "lenient") == (None, "none")


def test_string_and_url_evaluators():
    task = {"task_id": 1, "intent": "q", "eval": {"eval_types": ["string_match"],
                                                  "reference_answers": {"must_include": ["0"]}}}
    assert asyncio.run(evaluators.string_match(task, "It is 0.", None)) == 1.0
    assert asyncio.run(evaluators.string_match(task, "It is 10.", None)) == 0.0  # one char: whole tokens only
    task["eval"]["reference_answers"] = {"exact_match": "Quest Lumaflex Band"}
    assert asyncio.run(evaluators.string_match(task, '"quest lumaflex band"', None)) == 1.0
    url_task = {"task_id": 2, "eval": {"reference_url": "http://h/a/search?q=x |OR| http://h/b", "url_note": None}}
    assert evaluators.url_match(url_task, "http://h/a/search/?q=x&p=2") == 1.0
    assert evaluators.url_match(url_task, "http://h/a/search?q=y") == 0.0
    assert evaluators.reddit_get_post_url("http://r/f/books/59421/a-title/comment/3") == "http://r/f/books/59421/"


def test_task_sources_splits_and_skips():
    cfg = WebArenaConfig()
    tasks = all_tasks(cfg)
    assert len([t for t in tasks if t < 812]) == 812 and len(local_items()) == 14
    kinds = [t["eval"]["eval_types"] for tid, t in tasks.items() if tid < 812]
    assert [sum(name in k for k in kinds) for name in ("string_match", "url_match", "program_html")] == [335, 205, 411]
    skipped = skipped_tasks(cfg)
    fuzzy = {f"webarena_{tid}" for tid, t in tasks.items()
             if "fuzzy_match" in (t["eval"].get("reference_answers") or {})}
    assert set(skipped) == fuzzy and len(fuzzy) == 118 + 1
    assert skipped_tasks(replace(cfg, judge_url="http://127.0.0.1:9/v1")) == {}
    with pytest.raises(SkippedTask):
        task_for("webarena_817", cfg)
    test, train = split_items("test"), split_items("train")
    assert len(test) == 50 and len(train) == 762 and not set(test) & set(train)
    assert get_family("webarena").num_items == 826
    with pytest.raises(ValueError, match="REDDIT"):
        substitute("__REDDIT__/f/books", {})


# ---- live browser ------------------------------------------------------------------------------------------------
def test_observation_format(run, env, site):
    obs = run(env.reset("webarena_812"))
    text = obs.text
    assert text.startswith("OBSERVATION:\nTab 0 (current): Home Page\n\n[")
    assert f"\nURL: {site.url}/\nOBJECTIVE: What is the SKU of the Fusion Backpack?\nPREVIOUS ACTION: None" in text
    assert "\t[" in text and "searchbox 'Search'" in text and "link 'Fusion Backpack' url: " in text
    assert "focusable" not in text and "StaticText '$59.00'" in text
    other = WebArenaEnv(site.cfg)  # reset is deterministic: the same page reads the same in another context
    try:
        assert run(other.reset("webarena_812")).text == text
    finally:
        run(other.close())

    # Only what is in the 1280x720 viewport is shown; scrolling brings the rest in.
    long_page = "".join(f"<p>Paragraph number {k}</p>" for k in range(60))
    run(env.session.page.set_content(f"<html><head><title>Long</title></head><body>{long_page}</body></html>"))
    _, tree, _ = run(env.session.observe())
    assert "'Paragraph number 0'" in tree and "'Paragraph number 59'" not in tree
    r = run(env.step("```scroll [down]```"))
    assert "'Paragraph number 0'" not in r.observation and "'Paragraph number 25'" in r.observation


def test_scripted_agent_solves_every_local_task(run, env, site):
    cfg_skipped = skipped_tasks(site.cfg)
    solved = []
    for task_id, steps in SOLUTIONS.items():
        item = f"webarena_{task_id}"
        if item in cfg_skipped:
            continue
        site.shop.reset()
        results = run(play(env, item, steps))
        final = results[-1]
        assert all(r.valid_action for r in results), (item, [r.observation[-200:] for r in results])
        assert final.done and final.success and final.reward == 1.0, (item, final.info)
        solved.append(task_id)
    kinds = {k for t in solved for k in all_tasks(site.cfg)[t]["eval"]["eval_types"]}
    assert len(solved) == 13 and kinds == {"string_match", "url_match", "program_html"}


def test_each_evaluator_kind_scores_a_wrong_ending_zero(run, env, site):
    for kind, (task_id, steps) in WRONG_ENDINGS.items():
        site.shop.reset()
        final = run(play(env, f"webarena_{task_id}", steps))[-1]
        assert final.done and final.reward == 0.0 and not final.success and final.info["eval"][kind] == 0.0, kind


class _FakeJudge(BaseHTTPRequestHandler):
    """Stands in for an OpenAI-compatible LLM judge (no model that grades reliably runs on this machine): it says
    "correct" when the graded answer mentions grippiness, which tests the request/verdict plumbing."""

    def log_message(self, *args):
        return None

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        student = prompt.split("student answer:")[1]
        verdict = "correct" if "grippy" in student else "incorrect"
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"Verdict: {verdict}"}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())


def test_fuzzy_match_through_a_judge_endpoint(run, site):
    judge = ThreadingHTTPServer(("127.0.0.1", 0), _FakeJudge)
    threading.Thread(target=judge.serve_forever, daemon=True).start()
    cfg = replace(site.cfg, judge_url=f"http://127.0.0.1:{judge.server_address[1]}/v1", judge_model="grader")
    env = WebArenaEnv(cfg)
    try:
        right = run(play(env, "webarena_817", SOLUTIONS[817]))[-1]
        wrong = run(play(env, "webarena_817", [SOLUTIONS[817][0].__class__("stop", text="It is blue.")]))[-1]
    finally:
        run(env.close())
        judge.shutdown()
        judge.server_close()
    assert right.success and right.reward == 1.0
    assert wrong.done and wrong.reward == 0.0


def test_invalid_actions_are_shown_and_change_nothing(run, env):
    obs = run(env.reset("webarena_812"))
    cases = ["no backticks here", "```fly [3]```", "```click [999999]```", "```tab_focus [5]```",
             "```press [NoSuchKey]```"]
    for text in cases:
        r = run(env.step(text))
        assert not r.valid_action and not r.done and r.reward == 0.0
        assert "PREVIOUS ACTION: invalid action (" in r.observation
        assert r.observation.split("\nURL: ")[1].split("\n")[0] == obs.text.split("\nURL: ")[1].split("\n")[0]


def test_tabs_scrolling_and_history(run, env, site):
    obs = run(env.reset("webarena_812"))
    steps = ["```scroll [down]```", "```scroll [up]```", f"```hover [{find_element(obs.text, 'link', 'Bags')}]```",
             "```new_tab```", f"```goto [{site.url}/category/tees/]```", "```tab_focus [0]```",
             f"```click [{find_element(obs.text, 'link', 'Yoga')}]```", "```go_back```", "```go_forward```",
             "```press [Meta+a]```", "```tab_focus [1]```", "```close_tab```"]
    seen = []
    for text in steps:
        r = run(env.step(text))
        assert r.valid_action, (text, r.observation[-300:])
        seen.append(r.observation)
    assert "Tab 0: Home Page | Tab 1 (current): Tees" in seen[4]
    assert seen[6].split("\nURL: ")[1].startswith(f"{site.url}/category/yoga/")
    assert seen[7].split("\nURL: ")[1].startswith(f"{site.url}/\n")
    assert "Tab 1" not in seen[-1] and "(current): Yoga" in seen[-1]


def test_contexts_are_isolated_and_share_one_browser(run, env, site):
    other = WebArenaEnv(site.cfg)
    try:
        site.shop.reset()
        run(play(env, "webarena_821", SOLUTIONS[821][:-1]))  # two backpacks in env's cart, no stop
        obs = run(other.reset("webarena_812"))
        assert "My Cart (0)" in obs.text and other.host is env.host and env.host.launches == 1
        r = run(env.step("```stop```"))
        assert r.success
    finally:
        run(other.close())
    assert env.host.connected()  # the other env's close leaves the shared browser running


def test_login_through_the_browser_saves_a_usable_state(run, tmp_path, site):
    path = run(save_login_state(["shopping"], tmp_path, urls={"shopping": site.url}))
    assert path.name == "shopping_state.json" and "shop_login" in path.read_text()
    env = WebArenaEnv(replace(site.cfg, storage_state_dir=str(tmp_path)))
    try:
        final = run(play(env, "webarena_816", SOLUTIONS[816]))[-1]
    finally:
        run(env.close())
    assert final.success


def test_a_crashed_browser_is_replaced_and_counted(run, site):
    env = WebArenaEnv(site.cfg)
    obs = run(env.reset("webarena_812"))
    restarts = obs.info["browser_restarts"]
    pid = env.host.browser_pid()
    assert pid is not None
    browser = psutil.Process(pid)  # one handle: its parent may reap the killed browser before a second lookup
    browser.kill()
    try:
        browser.wait(10)
    except psutil.NoSuchProcess:
        pass
    try:
        with pytest.raises(Exception):
            run(env.step(f"```click [{find_element(obs.text, 'link', 'Bags')}]```"))
    finally:
        run(env.close())  # the pool closes a broken env and makes a new one
    fresh = WebArenaEnv(site.cfg)
    try:
        obs = run(fresh.reset("webarena_812"))
        assert obs.info["browser_restarts"] == restarts + 1 and fresh.host.connected()
        final = run(play(fresh, "webarena_812", SOLUTIONS[812]))[-1]
        assert final.success
    finally:
        run(fresh.close())


def test_kill_ends_the_browser_of_an_env_whose_close_hangs(run, site):
    env = WebArenaEnv(site.cfg)
    run(env.reset("webarena_812"))
    pid = env.host.browser_pid()
    assert pid is not None and psutil.pid_exists(pid)
    browser = psutil.Process(pid)
    env.kill()  # what the pool does when close times out; from another thread than the env's loop
    try:
        browser.wait(10)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    run(env.close())  # closing what is left of it still works


def test_family_through_the_registry(run, site):
    family = get_family("webarena")
    assert family.extras["max_instances_per_actor"](site.cfg) == 4
    rng = random.Random(2)

    async def episode():
        env = family.make_env(site.cfg)
        try:
            for item in family.extras["contract_items"]:
                obs = await env.reset(item)
                text = obs.text
                for _ in range(3):
                    r = await env.step(family.extras["scripted_reply"](text, rng))
                    assert r.valid_action and not r.done
                    text = r.observation
        finally:
            await env.close()

    run(episode())


def test_evaluation_helpers_against_the_shop(run, env, site):
    site.shop.reset()
    assert evaluators.shopping_get_latest_order_url() == f"{site.url}/sales/order/view/order_id/3/"
    assert evaluators.shopping_get_sku_latest_review_author("24-MB02") == "Dario"
    assert evaluators.shopping_get_sku_latest_review_rating("24-MB02") == "80"
    assert evaluators.shopping_get_sku_latest_review_author("24-MB06") == ""  # no reviews
    run(env.reset("webarena_812"))
    members = ("<table><tr><td data-label='Account'><span class='gl-avatar-labeled-sublabel'>@{0}</span></td>"
               "<td class='col-max-role'><span>{1}</span></td></tr></table>")
    run(env.session.page.set_content(members.format("yjlou", "Developer") + members.format("koush", "Owner")))
    assert run(evaluators.gitlab_get_project_memeber_role(env.session.page, "koush")) == "Owner"
    assert run(evaluators.gitlab_get_project_memeber_role(env.session.page, "nobody")) == ""


def test_a_tree_still_named_for_the_previous_document_is_looked_at_again():
    """Under load the accessibility tree can lag a navigation: the tab already has the new title while the tree's
    root still names the old document (a CI run saw a search-results page observed without its results). A
    stand-in session (no browser: the race cannot be produced on demand) whose first two looks are stale: the
    third, fresh one is what is observed; a tree that stays stale is taken after STALE_TREE_S."""
    import time
    from types import SimpleNamespace

    from environments.webarena import env as webarena_env

    def session(stale_looks: int):
        looks = []

        async def observe():
            looks.append(len(looks))
            fake.stale_tree = len(looks) <= stale_looks
            return f"tabs {len(looks)}", f"tree {len(looks)}", False

        fake = SimpleNamespace(navigating=False, stale_tree=False, observe=observe,
                               page=SimpleNamespace(wait_for_load_state=lambda *a, **k: asyncio.sleep(0)))
        return fake, looks

    fake, looks = session(2)
    got = asyncio.run(webarena_env.BrowserSession.observe_settled(fake, settle_ms=0, timeout_ms=5000))
    assert got == ("tabs 3", "tree 3") and len(looks) == 3
    fake, looks = session(10**6)
    started = time.monotonic()
    asyncio.run(webarena_env.BrowserSession.observe_settled(fake, settle_ms=0, timeout_ms=30_000))
    assert webarena_env.STALE_TREE_S <= time.monotonic() - started < 30  # after the recheck, not at the deadline
