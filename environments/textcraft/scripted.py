"""A plausible reply for TextCraft read off the text alone (used by contract tests and benches)."""
from __future__ import annotations

import random

from environments.textcraft.planner import parse_commands


def scripted_reply(text: str, rng: random.Random) -> str:
    """Gets a base ingredient of a shown command most of the time, else crafts a shown command or looks at the
    inventory. `text` is the conversation so far or any text holding the first observation."""
    start = text.rfind("Crafting commands:")
    action = "inventory"
    if start >= 0:
        try:
            recipes, _ = parse_commands(text[start:])
        except RuntimeError:
            recipes = {}
        if recipes:
            output = rng.choice(sorted(recipes))
            count, inputs = rng.choice(recipes[output])
            roll = rng.random()
            base = [(n, i) for n, i in inputs if i not in recipes]
            if roll < 0.7 and base:
                n, item = rng.choice(base)
                action = f"get {n} {item}"
            elif roll < 0.9:
                action = f"craft {count} {output} using " + ", ".join(f"{n} {i}" for n, i in inputs)
    return f"Thought:\nLet me do this.\n\nAction:\n{action}"
