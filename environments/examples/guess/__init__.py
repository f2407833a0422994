"""The number-guessing example family: `FAMILY`, found through `env.families={guess: environments.examples.guess}`.

Options (`env.options.guess`, a plain mapping): `high` (the range is 1..high, default 100) and `parse_mode`
(`lenient`, the default, or `strict`).

| module | what it is |
|---|---|
| `env` | the game as an async `Env`: a secret number per item, strict and lenient parsing, higher/lower hints |
"""
from __future__ import annotations

import random
import re
from typing import Any, Mapping

from core.env import Env
from environments.examples.guess.env import FAMILY_NAME, GuessEnv
from environments.registry import Family

OPTIONS = {"high": 100, "parse_mode": "lenient"}


def make_env(options: Mapping[str, Any]) -> Env:
    """One env from `env.options.guess`; an unknown option is refused by name."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env.options.guess: unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    given = {**OPTIONS, **options}
    return GuessEnv(high=int(given["high"]), parse_mode=str(given["parse_mode"]))


def scripted_reply(text: str, rng: random.Random) -> str:
    """A valid reply read off the observations: a random guess inside the range the latest hint leaves."""
    high = int(re.findall(r"between 1 and (\d+)", text)[0]) if "between 1 and" in text else 100
    low, top = 1, high
    hint = re.findall(r"My number is (higher|lower) than (\d+)", text)
    if hint:
        way, k = hint[-1][0], int(hint[-1][1])
        low, top = (k + 1, high) if way == "higher" else (1, k - 1)
    guess = rng.randint(low, max(low, top))
    return f"I will try {guess}.\nAction: guess {guess}"


FAMILY = Family(
    name=FAMILY_NAME,
    make_env=make_env,
    num_items=1000,  # ids guess_0 ... guess_999
    split_sizes={"train": 800, "test": 200},  # generated deterministically when env.data_dir has no files
    reference_max_turns=10,  # the turn limit evaluation uses unless eval.max_turns is set
    extras={"scripted_reply": scripted_reply, "contract_items": ["guess_0", "guess_1", "guess_999"]},
)
