"""TextCraft's lenient action rule: the last well-formed command named anywhere in a reply.

Commands are parameterised (`get N <item>`, `craft N <item> using N <a>, N <b>`, `inventory`), so "available
actions" means every command built from names the recipe book knows. The reply is lower-cased and stripped of
punctuation first ("...so: Get 1 Lapis-Lazuli!" names `get 1 lapis lazuli`); the command comes back in the
form the game reads.
"""
from __future__ import annotations

import functools
import re

from environments.parsing import normalize
from environments.textcraft.recipes import RecipeBook


class LenientMatcher:
    def __init__(self, book: RecipeBook):
        names = sorted({normalize(n) for n in book.names}, key=lambda n: (-len(n), n))
        item = "(?:" + "|".join(re.escape(n) for n in names) + ")"
        self._pair = re.compile(rf"(\d+) ({item})(?= |$)")
        commands = rf"get (\d+) ({item})|craft (\d+) ({item}) using ((?:\d+ {item} ?)+)|inventory"
        self._command = re.compile(rf"(?<![a-z0-9])(?:{commands})(?![a-z0-9])")

    def find(self, reply: str) -> str | None:
        text = normalize(reply)
        last = None
        for last in self._command.finditer(text):
            pass
        if last is None:
            return None
        if last.group(1) is not None:
            return f"get {last.group(1)} {last.group(2)}"
        if last.group(3) is not None:
            inputs = ", ".join(f"{n} {name}" for n, name in self._pair.findall(last.group(5).strip()))
            return f"craft {last.group(3)} {last.group(4)} using {inputs}"
        return "inventory"


@functools.cache
def matcher_for(book: RecipeBook) -> LenientMatcher:
    return LenientMatcher(book)
