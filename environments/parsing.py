"""Extracting one action from an agent's free-text reply: the reference's strict ReAct rule and a lenient rule.

What must hold:
- `strict` is the reference's rule for BabyAI and TextCraft: the text after `Action:` (whitespace and newlines
  right after the marker are skipped) up to the end of that line, keeping only letters, digits, commas and
  spaces, with runs of spaces collapsed. A reply without an `Action:` line has no action.
- `lenient` first tries the strict rule; when that yields nothing the env accepts, it takes the *last*
  available action named anywhere in the reply, ignoring case and punctuation ("...so I will Pickup the red
  ball 1!" names `pickup red ball 1`). A small model rarely writes a well-formed `Action:` line; without a
  valid action there is no reward to learn from.
- In both modes a reply with more than one `Action:` marker is rejected with an explanatory error (the format
  allows one action per turn; the reference rejects it too).
- Nothing here raises on any input (empty, huge, non-ASCII); the result says which rule found the action
  (`strict`, `lenient`, or `none`) and, when none was found, why.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

STRICT = "strict"
LENIENT = "lenient"
EXACT = "exact"  # lenient mode, and the whole reply is the action's name: the format asked for, kept to
NONE = "none"
MODES = (STRICT, LENIENT)

MARKER = "Action:"
MULTIPLE_ACTIONS = "Error: Only one 'Action' is allowed per response. Please adjust your response."
NO_ACTION_STRICT = ("No action found. End your reply with a line 'Action:' followed by exactly one action, "
                    "for example:\nThought:\n...\n\nAction:\n{example}")
NO_ACTION_LENIENT = "No available action found in your reply. Name exactly one of the available actions."

_LINE_AFTER_MARKER = re.compile(r"Action:\s*([^\n]*)")
_NOT_KEPT = re.compile(r"[^A-Za-z0-9, ]+")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class Parsed:
    action: str | None  # the extracted action, or None
    rule: str  # STRICT, LENIENT, EXACT or NONE
    error: str = ""  # why no action was found (an observation for the agent); empty when one was

    @property
    def found(self) -> bool:
        return self.action is not None


def clean_action(text: str) -> str:
    """The reference's cleaning: keep letters, digits, commas and spaces; collapse spaces."""
    return " ".join(_NOT_KEPT.sub("", text).split())


def normalize(text: str) -> str:
    """Lower-case, every run of non-alphanumerics becomes one space (used to compare names leniently)."""
    return " ".join(_NOT_ALNUM.sub(" ", text.lower()).split())


def count_markers(reply: str) -> int:
    return reply.count(MARKER)


def strict_line(reply: str) -> str | None:
    """The cleaned rest of the line after the single `Action:` marker, or None (no marker, or it is empty)."""
    match = _LINE_AFTER_MARKER.search(reply)
    if match is None:
        return None
    action = clean_action(match.group(1))
    return action or None


def strict_rest(reply: str) -> str | None:
    """SciWorld's rule: everything after the last `Action:`, stripped; None when there is no marker."""
    head, sep, tail = reply.rpartition(MARKER)
    if not sep:
        return None
    return tail.strip() or None


def last_named(reply: str, candidates: Iterable[str]) -> str | None:
    """The candidate whose normalized form occurs last in the normalized reply (as whole words).

    Ties (two candidates ending at the same place, e.g. "red ball 1" inside "go to red ball 1") go to the
    longer one. Returns the candidate as given, not normalized.
    """
    text = f" {normalize(reply)} "
    best: tuple[int, int] | None = None
    chosen = None
    for cand in candidates:
        norm = normalize(cand)
        if not norm:
            continue
        at = text.rfind(f" {norm} ")
        if at < 0:
            continue
        key = (at + len(norm), len(norm))
        if best is None or key > best:
            best, chosen = key, cand
    return chosen


def parse_reply(reply: str, mode: str, accepts: Callable[[str], bool],
                lenient_find: Callable[[str], str | None], example: str = "turn left") -> Parsed:
    """Extract one action from `reply` under `mode`.

    `accepts(action)` says whether the env would recognise a strictly-extracted action (lenient mode falls
    back to `lenient_find` when it would not); `lenient_find(reply)` returns the last available action named
    in the reply, or None.
    """
    if mode not in MODES:
        raise ValueError(f"parse mode {mode!r}: expected one of {', '.join(MODES)}")
    if count_markers(reply) > 1:
        return Parsed(None, NONE, MULTIPLE_ACTIONS)
    action = strict_line(reply)
    if mode == STRICT:
        if action is None:
            return Parsed(None, NONE, NO_ACTION_STRICT.format(example=example))
        return Parsed(action, STRICT)
    if action is not None and accepts(action):
        return Parsed(action, STRICT)
    found = lenient_find(reply)
    if found is not None:
        return Parsed(found, EXACT if normalize(reply) == normalize(found) else LENIENT)
    if action is not None:  # a strict action the env does not know: let the env explain why
        return Parsed(action, STRICT)
    return Parsed(None, NONE, NO_ACTION_LENIENT)
