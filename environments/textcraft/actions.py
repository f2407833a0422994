"""The actions a TextCraft observation names, for baselines that choose among them (the random policy).

TextCraft lists no actions as such; its first observation lists the crafting commands. The actions read off
it are: each shown `craft ...` command as written, `get N <item>` for each ingredient that no shown command
makes (with the count a command uses; a generic tag such as "planks" is named as shown, and getting it fails
as it would for the model), and `inventory`. Later observations do not repeat the commands, so the text given
is the conversation so far.
"""
from __future__ import annotations

from environments.textcraft.planner import parse_commands

INVENTORY = "inventory"


def available_actions(conversation: str) -> list[str]:
    """The actions named by the last `Crafting commands:` block in `conversation` (just `inventory` if none)."""
    start = conversation.rfind("Crafting commands:")
    if start < 0:
        return [INVENTORY]
    block = conversation[start:]
    try:
        recipes, _ = parse_commands(block)
    except RuntimeError:
        recipes = {}
    crafts, gets = [], {}
    for output in sorted(recipes):
        for count, inputs in recipes[output]:
            crafts.append(f"craft {count} {output} using " + ", ".join(f"{n} {i}" for n, i in inputs))
            for n, item in inputs:
                if item not in recipes:
                    gets.setdefault(f"get {n} {item}", None)
    return [*crafts, *gets, INVENTORY]
