"""WebArena's evaluators, run when the agent stops: the score is the product of the task's eval_types, each 0 or 1.

- string_match on the stop answer (lower-cased, one pair of surrounding quotes removed):
  exact_match: equal; must_include: every phrase is a substring (a one-character phrase that is the only one
  must be a whole token, so "0" does not match "10"); fuzzy_match: an LLM judge at `env.webarena.judge_url`
  (an OpenAI-compatible /chat/completions endpoint) says the answer means the reference ("N/A" references: an
  exact "N/A", else the judge compares the stated reason with the task's string_note).
- url_match ("GOLD in PRED"): some reference URL's host+path is contained in the final page's, and every query
  parameter of the references has one of its values in the final URL. References are split on " |OR| ".
- program_html: for each target, open its URL in a new tab of the same context ("last": the final page as it
  is; "func:..." a helper that computes the URL), select content with its locator (empty: the whole HTML;
  `document...` JavaScript; "func:..." a helper), and check exact_match / must_include (" |OR| " alternatives).
  The helpers are WebArena's: the shopping site's REST API (latest order, latest review author/rating, with its
  default admin account), reddit's post URL, gitlab's member role.
A judge failure raises (an env error); it never becomes a silent zero.
"""
from __future__ import annotations

import ast
import asyncio
import collections
import html
import json
import os
import re
import urllib.parse
import urllib.request

SHOP_ADMIN = {"username": "admin", "password": "admin1234"}  # WebArena's published default for its shopping site
_TOKEN = re.compile(r"\w+|[^\w\s]")


def clean_answer(answer: str) -> str:
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(pred) == clean_answer(ref))


def must_include(ref: str, pred: str, tokenize: bool = False) -> float:
    ref, pred = clean_answer(ref), clean_answer(pred)
    if tokenize and len(ref) == 1:
        return float(ref in _TOKEN.findall(pred))
    return float(ref in pred)


class Judge:
    """An OpenAI-compatible chat endpoint used as the fuzzy-match grader."""

    def __init__(self, url: str, model: str, timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s

    def _post(self, prompt: str) -> str:
        body = {"model": self.model, "temperature": 0, "max_tokens": 256,
                "messages": [{"role": "system", "content": "You are a careful grader."},
                             {"role": "user", "content": prompt}]}
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            payload = json.loads(response.read())
        try:
            return str(payload["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"judge at {self.url} answered in an unexpected shape: {str(payload)[:200]}") from e

    async def fuzzy(self, question: str, reference: str, pred: str) -> float:
        prompt = (f"Grade a student's answer against the reference answer to a question. Different wording is "
                  f"fine; judge whether the meaning is the same. 'N/A' means the task cannot be done.\n"
                  f"question: {question}\nreference answer: {reference}\nstudent answer: {pred}\n"
                  f"End with one verdict: correct, incorrect, or partially correct.")
        verdict = (await asyncio.to_thread(self._post, prompt)).lower()
        if "partially correct" in verdict or "incorrect" in verdict:
            return 0.0
        if "correct" in verdict:
            return 1.0
        raise ValueError(f"judge verdict has neither 'correct' nor 'incorrect': {verdict[:200]!r}")

    async def same_reason(self, task: str, reason: str, reported: str) -> float:
        prompt = (f"task: {task}\nactual reason it cannot be done: {reason}\nreported reason: {reported}\n"
                  f"Does the reported reason agree with the actual one, even implicitly? Answer 'same' or "
                  f"'different'.")
        verdict = (await asyncio.to_thread(self._post, prompt)).lower()
        if "different" in verdict:
            return 0.0
        if "same" in verdict:
            return 1.0
        raise ValueError(f"judge verdict has neither 'same' nor 'different': {verdict[:200]!r}")


async def string_match(task: dict, answer: str, judge: Judge | None) -> float:
    pred = clean_answer(answer)
    score = 1.0
    for approach, value in (task["eval"].get("reference_answers") or {}).items():
        if approach == "exact_match":
            score *= exact_match(value, pred)
        elif approach == "must_include":
            for phrase in value:
                score *= must_include(phrase, pred, tokenize=len(value) == 1)
        elif approach == "fuzzy_match":
            if judge is None:
                raise ValueError(f"task {task['task_id']} needs a fuzzy_match judge (env.webarena.judge_url)")
            if value == "N/A":
                score *= exact_match("N/A", pred) or await judge.same_reason(
                    task["intent"], task["eval"].get("string_note", ""), pred)
            else:
                for reference in value:
                    score *= await judge.fuzzy(task["intent"], reference, pred)
        else:
            raise ValueError(f"task {task['task_id']}: unknown string_match approach {approach!r}")
    return score


def url_match(task: dict, final_url: str) -> float:
    def parts(url: str) -> tuple[str, dict[str, list[str]]]:
        parsed = urllib.parse.urlparse(url.rstrip("/"))
        return parsed.netloc + parsed.path, urllib.parse.parse_qs(parsed.query)

    rule = task["eval"].get("url_note") or "GOLD in PRED"
    if rule != "GOLD in PRED":
        raise ValueError(f"task {task['task_id']}: unknown url matching rule {rule!r}")
    pred_base, pred_query = parts(final_url)
    ref_bases, ref_queries = [], collections.defaultdict(set)
    for ref in task["eval"]["reference_url"].split(" |OR| "):
        base, query = parts(ref)
        ref_bases.append(base)
        for key, values in query.items():
            ref_queries[key].update(values)
    score = float(any(base in pred_base for base in ref_bases))
    for key, values in ref_queries.items():
        score *= float(any(v in pred_query.get(key, []) for v in values))
    return score


# ---- WebArena's evaluation helpers ---------------------------------------------------------------------------
def _shop_url() -> str:
    url = os.environ.get("SHOPPING", "").rstrip("/")
    if not url:
        raise ValueError("a shopping evaluation helper needs the SHOPPING environment variable")
    return url


def _rest(path: str, token: str | None = None, body: dict | None = None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{_shop_url()}{path}", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _admin_token() -> str:
    return str(_rest("/rest/default/V1/integration/admin/token", body=SHOP_ADMIN))


def shopping_get_latest_order_url() -> str:
    query = urllib.parse.urlencode({"searchCriteria[sortOrders][0][field]": "created_at",
                                    "searchCriteria[sortOrders][0][direction]": "DESC",
                                    "searchCriteria[pageSize]": "1"})
    latest = _rest(f"/rest/V1/orders?{query}", token=_admin_token())["items"][0]
    return f"{_shop_url()}/sales/order/view/order_id/{int(latest['increment_id'])}/"


def _latest_review(sku: str) -> dict | None:
    reviews = _rest(f"/rest/V1/products/{urllib.parse.quote(sku)}/reviews", token=_admin_token())
    return reviews[-1] if reviews else None


def shopping_get_sku_latest_review_author(sku: str) -> str:
    review = _latest_review(sku)
    return str(review["nickname"]) if review else ""


def shopping_get_sku_latest_review_rating(sku: str) -> str:
    review = _latest_review(sku)
    return str(review["ratings"][0]["percent"]) if review else ""


def reddit_get_post_url(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    parts = parsed.path.split("/")
    if len(parts) < 4 or parts[1] != "f":
        return url
    return f"{parsed.scheme}://{parsed.netloc}/f/{parts[2]}/{parts[3]}/"


async def gitlab_get_project_memeber_role(page, account_name: str) -> str:
    script = """(name) => {
      const accounts = [...document.querySelectorAll("td[data-label='Account'] span.gl-avatar-labeled-sublabel")];
      const i = accounts.findIndex(e => e.outerText === '@' + name);
      const roles = document.querySelectorAll("td.col-max-role span");
      return i >= 0 && roles[i] ? roles[i].outerText : "";
    }"""
    try:
        return str(await page.evaluate(script, account_name))
    except Exception:  # noqa: BLE001 - the reference scores a page without the table as an empty role
        return ""


_URL_HELPERS = {"shopping_get_latest_order_url": shopping_get_latest_order_url,
                "reddit_get_post_url": reddit_get_post_url}
_CONTENT_HELPERS = {"shopping_get_sku_latest_review_author": shopping_get_sku_latest_review_author,
                    "shopping_get_sku_latest_review_rating": shopping_get_sku_latest_review_rating}


def _call_parts(expr: str, page_url: str) -> tuple[str, list]:
    m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*", expr, re.DOTALL)
    if not m:
        raise ValueError(f"cannot read helper call {expr!r}")
    args_src = m.group(2).replace("__last_url__", page_url).replace("__page__", "None")
    args = list(ast.literal_eval(f"({args_src},)")) if args_src.strip() else []
    return m.group(1), args


async def _helper_url(expr: str, page) -> str:
    name, args = _call_parts(expr, page.url)
    if name not in _URL_HELPERS:
        raise ValueError(f"unknown URL helper {name!r}")
    return await asyncio.to_thread(_URL_HELPERS[name], *args)


async def _helper_content(expr: str, page) -> str:
    name, args = _call_parts(expr, page.url)
    if name == "gitlab_get_project_memeber_role":
        return await gitlab_get_project_memeber_role(page, *args[1:])
    if name not in _CONTENT_HELPERS:
        raise ValueError(f"unknown content helper {name!r}")
    return await asyncio.to_thread(_CONTENT_HELPERS[name], *args)


async def _select(page, target: dict) -> str:
    locator = target.get("locator", "") or ""
    if not locator.strip():
        return await page.content()
    if locator.startswith(("document.", "[...document.")):
        for prep in target.get("prep_actions", []):
            try:
                await page.evaluate(f"() => {prep}")
            except Exception:  # noqa: BLE001 - as in the reference, a failed preparation leaves the page as is
                pass
        try:
            value = await page.evaluate(f"() => {locator}")
        except Exception:  # noqa: BLE001 - the element is missing: the page is wrong, which scores 0
            return ""
        return "" if value is None else str(value)
    if locator.startswith("func:"):
        return await _helper_content(locator[len("func:"):], page)
    raise ValueError(f"unknown program_html locator {locator!r}")


async def program_html(task: dict, page, timeout_ms: float) -> float:
    score = 1.0
    for target in task["eval"]["program_html"]:
        url = target["url"]
        if url.startswith("func:"):
            url = await _helper_url(url[len("func:"):], page)
        probe = page
        if url != "last":
            probe = await page.context.new_page()
            await probe.goto(url, wait_until="load", timeout=timeout_ms)
        try:
            selected = html.unescape(await _select(probe, target))
        finally:
            if probe is not page:
                await probe.close()
        required = target["required_contents"]
        if "exact_match" in required:
            score *= exact_match(required["exact_match"], selected)
        elif "must_include" in required:
            for content in required["must_include"]:
                score *= float(any(must_include(alt, selected) for alt in content.split(" |OR| ")))
        else:
            raise ValueError(f"task {task['task_id']}: unknown required_contents {list(required)}")
    return score


async def evaluate(task: dict, answer: str, page, judge: Judge | None, timeout_ms: float) -> tuple[float, dict]:
    """(score, per-evaluator scores) of a finished episode."""
    parts: dict[str, float] = {}
    for kind in task["eval"]["eval_types"]:
        if kind == "string_match":
            parts[kind] = await string_match(task, answer, judge)
        elif kind == "url_match":
            parts[kind] = url_match(task, page.url)
        elif kind == "program_html":
            parts[kind] = await program_html(task, page, timeout_ms)
        else:
            raise ValueError(f"task {task['task_id']}: unknown eval type {kind!r}")
    score = 1.0
    for value in parts.values():
        score *= value
    return score, parts
