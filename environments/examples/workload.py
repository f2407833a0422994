"""A scripted workload family: episodes whose length in turns is set by the item, whatever the agent replies.

For benchmarks that must give every mode the same work: with fixed reply lengths (`rollout.min_tokens_per_turn`
equal to `rollout.max_tokens_per_turn`) the tokens of an episode depend on its item alone, so runs that train
the same items train the same tokens. Registered like any family of your own:
`env.families={workload: environments.examples.workload}`, options in `env.options.workload`:

- `turns` (default 3): every episode takes this many turns;
- `long_tail` (default false): the turns of each item come from a heavy tail: `turns` for half the items,
  twice it for 1/4, 4 times 1/8, 8 times 1/16 and 16 times 1/16 (mean 3 x `turns`), so a few episodes run 8 to
  16 times longer than most, as agent tasks do;
- `seed` (default 0): the order of the long tail's deck.

The tail is dealt from a stratified deck, not drawn: item n is card n % 16 of block n // 16, and every block of
16 items holds exactly the tail's shares (8, 4, 2, 1 and 1 items of 1, 2, 4, 8 and 16 x `turns`) in an order that
is a pure function of (seed, block). The family's splits are its ids in order (train: workload_0 ... workload_799,
test: the rest) and the sampler deals them in that order (`in_order`), so every 16 groups a run starts, from
its first, carry the tail's weight: a window of whole blocks cannot hold more or fewer long episodes than the
tail gives. (A second epoch over the 800 train items deals the same cards again, in the same order.)

What must hold: `reset` is deterministic in the item id; the episode ends (done) exactly at its item's turn
count, never earlier, and never because of the reply: every reply is a turn. A reply with any word in it is a
valid action; an empty one is judged invalid (`valid_action` False) but still counts as its turn, which is
where this family departs from the env contract (a fixed workload must not depend on what the model wrote).
The reward at the last turn is the reply's share of distinct words (in [0, 1]), so that a group's rewards
differ and the learner's update is a real one. Steps are pure computation (`inline`).
"""
from __future__ import annotations

import random
from typing import Any, Mapping

from core.env import Observation, StepResult, SyncEnv, run_sync_env, split_item_id
from environments.registry import Family

FAMILY_NAME = "workload"
OPTIONS = {"turns": 3, "long_tail": False, "seed": 0}
TAIL = ((1, 8), (2, 4), (4, 2), (8, 1), (16, 1))  # (multiple of `turns`, cards out of every block of 16)
BLOCK = sum(cards for _, cards in TAIL)
TRAIN_ITEMS, NUM_ITEMS = 800, 1000
INSTRUCTION = "Each turn, write one short sentence about anything."


def deck_block(seed: int, block: int) -> list[int]:
    """The multiples of `turns` of block `block`'s 16 items: exactly the tail's shares, in a seeded order."""
    cards = [multiple for multiple, count in TAIL for _ in range(count)]
    random.Random(f"{FAMILY_NAME}/deck/{seed}/{block}").shuffle(cards)
    return cards


def turns_for(item_id: str, turns: int, long_tail: bool, seed: int = 0) -> int:
    """How many turns the episode of `item_id` takes."""
    family, n = split_item_id(item_id)
    if family != FAMILY_NAME:
        raise ValueError(f"item id {item_id!r} is not a {FAMILY_NAME} item")
    if not long_tail:
        return turns
    return turns * deck_block(seed, int(n) // BLOCK)[int(n) % BLOCK]


def split_items(options: Mapping[str, Any], split: str) -> list[str]:
    """The splits in id order (the deck's order): train workload_0 ... workload_799, test the rest."""
    numbers = range(TRAIN_ITEMS) if split == "train" else range(TRAIN_ITEMS, NUM_ITEMS)
    return [f"{FAMILY_NAME}_{n}" for n in numbers]


class WorkloadEnv(SyncEnv):
    family = FAMILY_NAME
    inline = True

    def __init__(self, turns: int = 3, long_tail: bool = False, seed: int = 0):
        if turns < 1:
            raise ValueError(f"env.options.workload.turns: expected >= 1, got {turns}")
        self.turns, self.long_tail, self.seed = turns, long_tail, seed
        self.length = 0
        self.turn = 0

    def reset(self, item_id: str) -> Observation:
        self.length, self.turn = turns_for(item_id, self.turns, self.long_tail, self.seed), 0
        return Observation(text=f"Task {item_id}: {self.length} turns. Turn 1.", instruction=INSTRUCTION)

    def step(self, text: str) -> StepResult:
        if self.turn >= self.length:
            raise RuntimeError("workload: step() before reset(), or after the episode ended")
        self.turn += 1
        words = text.split()
        valid, rule = (True, "lenient") if words else (False, "none")
        if self.turn < self.length:
            return StepResult(f"Turn {self.turn + 1}.", 0.0, False, valid, rule)
        reward = len(set(words)) / len(words) if words else 0.0
        return StepResult("Done.", reward, True, valid, rule)


def make_env(options: Mapping[str, Any]):
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env.options.workload: unknown option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(OPTIONS)}")
    given = {**OPTIONS, **options}
    turns, long_tail = given["turns"], given["long_tail"]
    if not isinstance(turns, int) or isinstance(turns, bool):
        raise ValueError(f"env.options.workload.turns: expected an int, got {turns!r}")
    if not isinstance(long_tail, bool):
        raise ValueError(f"env.options.workload.long_tail: expected true or false, got {long_tail!r}")
    seed = given["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"env.options.workload.seed: expected an int, got {seed!r}")
    return run_sync_env(WorkloadEnv(turns, long_tail, seed))


FAMILY = Family(
    name=FAMILY_NAME,
    make_env=make_env,
    num_items=NUM_ITEMS,  # ids workload_0 ... workload_999
    split_sizes={"train": TRAIN_ITEMS, "test": NUM_ITEMS - TRAIN_ITEMS},
    reference_max_turns=48,  # the longest episode of the tail at turns=3
    extras={"contract_items": ["workload_0", "workload_1", "workload_999"],
            "config_split_items": split_items, "in_order": True},  # dealt in id order: the deck's order
)
