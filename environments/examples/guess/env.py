"""A number-guessing game as a text environment: the smallest complete example of an env family.

What must hold (the contract of core.env):
- `reset("guess_<n>")` picks the secret number from n alone, so the same item gives the same game in any process.
- `step(reply)` extracts one action from the whole reply: `strict` takes a line `Action: guess <k>`; `lenient`
  takes that, or else the last whole number written anywhere in the reply. A reply without an action, or a
  number outside the range, is answered with an explanation, costs nothing and changes nothing.
- A guess is answered "higher" or "lower"; the right one ends the episode with reward
  1 - 0.5 * (guesses before it) / max_guesses (so 1 for a first-try hit, never below 0.5) and success.
- Nothing here blocks, so it implements the async `Env` directly (a blocking env would be a `SyncEnv` wrapped
  by `run_sync_env`).
"""
from __future__ import annotations

import random
import re

from core.env import Env, Observation, StepResult, split_item_id

FAMILY_NAME = "guess"
_STRICT = re.compile(r"^\s*Action:\s*guess\s+(-?\d+)\s*$", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"-?\d+")

INSTRUCTION = """I am thinking of a whole number. Find it in as few guesses as you can. Each turn, reason briefly, \
then end your reply with exactly one line of this form:
Action: guess <number>
After each guess I tell you whether my number is higher or lower."""


def secret_for(item_id: str, high: int) -> int:
    """The secret number of item `guess_<n>`: drawn from 1..high by a generator seeded with n."""
    family, n = split_item_id(item_id)
    if family != FAMILY_NAME:
        raise ValueError(f"item id {item_id!r} is not a {FAMILY_NAME} item")
    return random.Random(f"{FAMILY_NAME}/{n}").randint(1, high)


def parse_guess(reply: str, parse_mode: str) -> tuple[int | None, str]:
    """(the guessed number or None, the rule that found it: "strict", "lenient" or "none")."""
    strict = _STRICT.findall(reply)
    if len(strict) == 1:
        return int(strict[0]), "strict"
    if parse_mode == "lenient" and len(strict) == 0:
        numbers = _NUMBER.findall(reply)
        if numbers:
            return int(numbers[-1]), "lenient"
    return None, "none"


class GuessEnv(Env):
    family = FAMILY_NAME

    def __init__(self, high: int = 100, parse_mode: str = "lenient"):
        if high < 1:
            raise ValueError(f"high: expected >= 1, got {high}")
        if parse_mode not in ("strict", "lenient"):
            raise ValueError(f"parse_mode: expected strict or lenient, got {parse_mode!r}")
        self.high = high
        self.parse_mode = parse_mode
        self.max_guesses = max(1, high.bit_length())  # what a binary search needs
        self.secret: int | None = None
        self.guesses = 0

    async def reset(self, item_id: str) -> Observation:
        self.secret = secret_for(item_id, self.high)
        self.guesses = 0
        return Observation(text=f"My number is between 1 and {self.high}. What is your first guess?",
                           instruction=INSTRUCTION, info={"high": self.high})

    async def step(self, text: str) -> StepResult:
        if self.secret is None:
            raise RuntimeError("guess: step() before reset(), or after the episode ended")
        guess, rule = parse_guess(text, self.parse_mode)
        if guess is None:
            return StepResult("No guess found. End your reply with one line: Action: guess <number>", 0.0,
                              False, False, rule)
        if not 1 <= guess <= self.high:
            return StepResult(f"{guess} is outside 1..{self.high}. Guess again.", 0.0, False, False, rule)
        self.guesses += 1
        if guess == self.secret:
            reward = max(0.5, 1.0 - 0.5 * (self.guesses - 1) / self.max_guesses)
            self.secret = None
            return StepResult(f"Correct, it is {guess}!", reward, True, True, rule, success=True,
                              info={"guesses": self.guesses})
        hint = "higher" if self.secret > guess else "lower"
        return StepResult(f"My number is {hint} than {guess}.", 0.0, False, True, rule)
