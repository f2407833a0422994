"""A plausible valid reply for BabyAI, read off the observation text alone (used by contract tests and benches)."""
from __future__ import annotations

import json
import random
import re

_LISTING = re.compile(r"Available actions: (\[[^\n]*\])")


def available_actions(text: str) -> list[str]:
    """The action list of the last `Available actions: [...]` line in `text` (empty if none)."""
    found = _LISTING.findall(text)
    if not found:
        return []
    try:
        actions = json.loads(found[-1])
    except ValueError:
        return []
    return [a for a in actions if isinstance(a, str)]


def scripted_reply(text: str, rng: random.Random) -> str:
    """A ReAct reply naming one available action, preferring ones that act on an object."""
    actions = [a for a in available_actions(text) if a != "check available actions"] or ["turn left"]
    targeted = [a for a in actions if a.startswith(("go to", "pickup", "go through", "toggle and"))]
    choice = rng.choice(targeted if targeted and rng.random() < 0.7 else actions)
    return f"Thought:\nI will try {choice}.\n\nAction:\n{choice}"
