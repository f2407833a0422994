"""WebArena's action grammar: extraction from an agent reply, parsing, and execution on a browser session.

Grammar (element ids are those of the current observation's accessibility tree):
    click [id]            type [id] [text] [0|1]   (1, the default, presses Enter after typing)
    hover [id]            press [key combination]  (e.g. Control+a; Meta is read as Control off macOS)
    scroll [down|up]      new_tab      tab_focus [index]      close_tab
    goto [url]            go_back      go_forward             stop [answer]   (stop without [..] answers "")

Extraction: `strict` takes the first ```...``` block of the reply (the reference's rule; its prompt ends with
"In summary, the next action I will perform is ```click [12]```"); `lenient` takes the last such block, or
without one the last line that starts with an action keyword.

Execution follows the reference (clicks at the element's centre, typing through the keyboard, scrolling by one
viewport height), with one deliberate change: `type` first clears a text field that already holds text, so
typing twice into a search box replaces the query rather than appending to it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

KEYWORDS = ("click", "type", "hover", "press", "scroll", "new_tab", "tab_focus", "close_tab", "goto", "go_back",
            "go_forward", "stop")
_BLOCK = re.compile(r"```((?:.|\n)*?)```")
_LINE = re.compile(r"^\s*(?:action\s*:\s*)?[`'\"]*((?:%s)\b.*)$" % "|".join(KEYWORDS), re.IGNORECASE | re.MULTILINE)


class ActionError(ValueError):
    """The agent's action is malformed or cannot be carried out on the current page (shown to the agent)."""


@dataclass(frozen=True)
class Action:
    kind: str
    element_id: str = ""
    argument: str = ""  # text to type, keys to press, url, scroll direction or stop answer
    enter: bool = False
    index: int = 0

    def __str__(self) -> str:
        if self.kind in ("click", "hover"):
            return f"{self.kind} [{self.element_id}]"
        if self.kind == "type":
            return f"type [{self.element_id}] [{self.argument}] [{int(self.enter)}]"
        if self.kind == "tab_focus":
            return f"tab_focus [{self.index}]"
        if self.kind in ("press", "scroll", "goto", "stop"):
            return f"{self.kind} [{self.argument}]"
        return self.kind


def extract(text: str, mode: str) -> tuple[str | None, str]:
    """(action string, rule) from an agent reply; rule is "strict", "lenient" or "none"."""
    blocks = [b.strip() for b in _BLOCK.findall(text)]
    if blocks and blocks[0]:
        return blocks[0], "strict"
    if mode == "strict":
        return None, "none"
    candidates = [b for b in blocks if b]
    if candidates:
        return candidates[-1], "lenient"
    lines = _LINE.findall(text)
    if lines:
        return lines[-1].strip().rstrip("`'\"").strip(), "lenient"
    return None, "none"


def parse(action_str: str) -> Action:
    """An action string -> Action. Raises ActionError naming what is wrong."""
    s = action_str.strip()
    if s.startswith(("python", "text", "plaintext")) and "\n" in s:
        s = s.split("\n", 1)[1].strip()  # a language tag after the opening fence
    keyword = (s.split("[")[0] if "[" in s else (s.split() or [""])[0]).strip().lower()
    if keyword in ("click", "hover"):
        m = re.search(rf"{keyword} ?\[(\d+)\]", s, re.IGNORECASE)
        if not m:
            raise ActionError(f"invalid {keyword} action {s!r}: expected {keyword} [id]")
        return Action(keyword, element_id=m.group(1))
    if keyword == "type":
        if not (s.endswith("[0]") or s.endswith("[1]")):
            s += " [1]"
        m = re.search(r"type ?\[(\d+)\] ?\[(.*)\] ?\[([01])\]", s, re.IGNORECASE | re.DOTALL)
        if not m:
            raise ActionError(f"invalid type action {s!r}: expected type [id] [text] [0|1]")
        return Action("type", element_id=m.group(1), argument=m.group(2), enter=m.group(3) == "1")
    if keyword == "press":
        m = re.search(r"press ?\[(.+)\]", s, re.IGNORECASE)
        if not m:
            raise ActionError(f"invalid press action {s!r}: expected press [keys]")
        return Action("press", argument=m.group(1))
    if keyword == "scroll":
        m = re.search(r"scroll ?\[?(up|down)\]?", s, re.IGNORECASE)
        if not m:
            raise ActionError(f"invalid scroll action {s!r}: expected scroll [down] or scroll [up]")
        return Action("scroll", argument=m.group(1).lower())
    if keyword == "goto":
        m = re.search(r"goto ?\[(.+)\]", s, re.IGNORECASE)
        if not m:
            raise ActionError(f"invalid goto action {s!r}: expected goto [url]")
        return Action("goto", argument=m.group(1).strip())
    if keyword == "tab_focus":
        m = re.search(r"tab_focus ?\[(\d+)\]", s, re.IGNORECASE)
        if not m:
            raise ActionError(f"invalid tab_focus action {s!r}: expected tab_focus [index]")
        return Action("tab_focus", index=int(m.group(1)))
    if keyword in ("new_tab", "close_tab", "go_back", "go_forward"):
        return Action(keyword)
    if keyword == "stop":
        m = re.search(r"stop ?\[(.*)\]", s, re.IGNORECASE | re.DOTALL)
        return Action("stop", argument=m.group(1).strip() if m else "")
    raise ActionError(f"invalid action {s!r}: expected one of {', '.join(KEYWORDS)}")


_CLEAR_FIELD = """() => {
  const e = document.activeElement;
  if (e && (e.tagName === 'INPUT' || e.tagName === 'TEXTAREA') && e.value) { e.select(); return true; }
  return false;
}"""
_SCROLL = "(document.scrollingElement || document.body).scrollTop = " \
          "(document.scrollingElement || document.body).scrollTop %s window.innerHeight;"


async def element_center(session, element_id: str) -> tuple[float, float]:
    """The centre of an element of the current tree, from its live layout (falling back to the observed box)."""
    node = session.nodes.get(element_id)
    if node is None:
        raise ActionError(f"there is no element [{element_id}] in the current view")
    try:
        quads = (await session.cdp.send("DOM.getContentQuads", {"backendNodeId": node.backend_id}))["quads"]
    except Exception:  # noqa: BLE001 - the node may have no box of its own; the observed box is still right
        quads = []
    if quads:
        q = quads[0]
        return sum(q[0::2]) / 4, sum(q[1::2]) / 4
    x, y, w, h = node.bounds
    return x + w / 2, y + h / 2


async def execute(action: Action, session) -> None:
    """Carry out a non-stop action on `session` (the env's BrowserSession). Raises ActionError for agent faults."""
    page = session.page
    kind = action.kind
    if kind in ("click", "hover", "type"):
        x, y = await element_center(session, action.element_id)
        if kind == "hover":
            await page.mouse.move(x, y)
            return
        await page.mouse.click(x, y)
        if kind == "type":
            if await page.evaluate(_CLEAR_FIELD):
                await page.keyboard.press("Backspace")
            await page.keyboard.type(action.argument)
            if action.enter:
                await page.keyboard.press("Enter")
    elif kind == "press":
        keys = action.argument
        if "Meta" in keys and "Mac" not in await page.evaluate("navigator.platform"):
            keys = keys.replace("Meta", "Control")
        await page.keyboard.press(keys)
    elif kind == "scroll":
        await page.evaluate(_SCROLL % ("-" if action.argument == "up" else "+"))
    elif kind == "goto":
        await page.goto(action.argument)
    elif kind == "go_back":
        await page.go_back()
    elif kind == "go_forward":
        await page.go_forward()
    elif kind == "new_tab":
        await session.switch_to(await session.context.new_page())
    elif kind == "tab_focus":
        pages = session.context.pages
        if not 0 <= action.index < len(pages):
            raise ActionError(f"there is no tab {action.index}; open tabs are 0..{len(pages) - 1}")
        await pages[action.index].bring_to_front()
        await session.switch_to(pages[action.index])
    elif kind == "close_tab":
        await page.close()
        pages = session.context.pages
        await session.switch_to(pages[-1] if pages else await session.context.new_page())
    else:
        raise ActionError(f"cannot execute {kind!r}")
