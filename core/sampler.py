"""Which item the next group trains on: a weighted env mix over per-env item lists, with a resumable cursor.

Each env's items are shuffled once per epoch with a seed derived from (seed, env, epoch) and taken in order,
except those of the envs in `in_order`, which are dealt in the order given, every epoch (a family whose items
form a deck, e.g. the workload family's stratified long tail);
the env of each next group is drawn from the mix weights with the sampler's own RNG. `state_dict` captures
the cursors and the RNG, so a resumed run draws exactly the items the uninterrupted run would have drawn.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


@dataclass
class _Stream:
    items: list[str]
    epoch: int = 0
    position: int = 0


class ItemSampler:
    def __init__(self, items: dict[str, list[str]], weights: dict[str, float], seed: int = 0,
                 in_order: frozenset[str] | set[str] = frozenset()):
        missing = [env for env in weights if not items.get(env)]
        if missing:
            raise ValueError(f"no items for env(s) {', '.join(missing)} in the mix")
        self.weights = {env: float(w) for env, w in weights.items() if w > 0}
        if not self.weights:
            raise ValueError("the env mix has no env with a weight > 0")
        self.seed, self.in_order = seed, frozenset(in_order)
        self._streams = {env: _Stream(list(items[env])) for env in self.weights}
        self.items = {env: self._streams[env].items for env in self.weights}
        self._order = {env: self._shuffled(env, 0) for env in self.weights}
        self._rng = random.Random(_seed(seed, "mix"))
        self.drawn = 0

    def _shuffled(self, env: str, epoch: int) -> list[str]:
        order = list(self._streams[env].items)
        if env in self.in_order:
            return order
        random.Random(_seed(self.seed, env, epoch)).shuffle(order)
        return order

    def next_item(self) -> str:
        envs = sorted(self.weights)
        env = self._rng.choices(envs, weights=[self.weights[e] for e in envs])[0]
        stream = self._streams[env]
        if stream.position >= len(stream.items):
            stream.epoch += 1
            stream.position = 0
            self._order[env] = self._shuffled(env, stream.epoch)
        item = self._order[env][stream.position]
        stream.position += 1
        self.drawn += 1
        return item

    def state_dict(self) -> dict:
        return {"seed": self.seed, "drawn": self.drawn, "rng": _rng_state(self._rng),
                "streams": {env: [s.epoch, s.position] for env, s in self._streams.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or set(state["streams"]) != set(self._streams):
            raise ValueError("sampler state is from a run with another seed or env mix")
        self.drawn = state["drawn"]
        self._rng.setstate(_rng_from_state(state["rng"]))
        for env, (epoch, position) in state["streams"].items():
            stream = self._streams[env]
            stream.epoch, stream.position = epoch, position
            self._order[env] = self._shuffled(env, epoch)


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_state(state: list) -> tuple:
    version, internal, gauss = state
    return version, tuple(internal), gauss
