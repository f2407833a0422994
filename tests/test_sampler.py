"""The item sampler: the env mix, epochs, and an exact resume from its state."""
from __future__ import annotations

import collections

import pytest

from core.sampler import ItemSampler

ITEMS = {"babyai": [f"babyai_{i}" for i in range(10)], "textcraft": [f"textcraft_{i}" for i in range(5)]}


def test_mix_weights_and_epochs():
    sampler = ItemSampler(ITEMS, {"babyai": 3.0, "textcraft": 1.0}, seed=1)
    drawn = [sampler.next_item() for _ in range(4000)]
    by_env = collections.Counter(d.split("_")[0] for d in drawn)
    assert 0.7 < by_env["babyai"] / 4000 < 0.8
    first_epoch = [d for d in drawn if d.startswith("babyai")][:10]
    assert sorted(first_epoch) == sorted(ITEMS["babyai"])  # every item once per epoch


def test_resume_continues_exactly():
    a = ItemSampler(ITEMS, {"babyai": 1.0, "textcraft": 1.0}, seed=7)
    for _ in range(23):
        a.next_item()
    state = a.state_dict()
    expected = [a.next_item() for _ in range(40)]
    b = ItemSampler(ITEMS, {"babyai": 1.0, "textcraft": 1.0}, seed=7)
    b.load_state_dict(state)
    assert [b.next_item() for _ in range(40)] == expected


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="webarena"):
        ItemSampler(ITEMS, {"webarena": 1.0})
    with pytest.raises(ValueError, match="another seed"):
        ItemSampler(ITEMS, {"babyai": 1.0}, seed=1).load_state_dict(
            ItemSampler(ITEMS, {"babyai": 1.0}, seed=2).state_dict())
