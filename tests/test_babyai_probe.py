"""The level probe (`python -m environments.babyai.probe`) on real minigrid levels: unseen items, a random
player's success within each turn limit (never falling as the limit grows), the expert's turns, the same figures
on every run, and a clear refusal of an unknown level."""
from __future__ import annotations

import pytest

from environments.babyai import unseen_items
from environments.babyai.env import BabyAIEnv
from environments.babyai.probe import main, probe_level, random_turns, unseen_ids


@pytest.fixture(scope="module")
def env():
    e = BabyAIEnv(parse_mode="strict")
    yield e
    e.close()


def test_the_items_are_the_unseen_ones_an_evaluation_draws():
    cfg = type("Cfg", (), {"levels": ["Open"]})()
    assert unseen_ids("Open", 5) == unseen_items(cfg, set(), 5)


def test_a_level_probe_counts_within_each_limit_and_repeats_itself(env):
    first = probe_level(env, "GoToRedBallGrey", seeds=8, limits=[1, 3, 20], expert_cap=10)
    assert first.items == 8 and list(first.random_within) == [1, 3, 20]
    shares = list(first.random_within.values())
    assert all(0.0 <= s <= 1.0 for s in shares) and shares == sorted(shares)
    assert shares[-1] > 0  # 20 turns of a one-room level: random finds the ball on some item
    assert len(first.expert_turns) + first.expert_failed == 8
    assert first.expert_turns == sorted(first.expert_turns) and all(1 <= t <= 10 for t in first.expert_turns)
    assert probe_level(env, "GoToRedBallGrey", seeds=8, limits=[1, 3, 20], expert_cap=10) == first


def test_a_random_win_is_reported_at_its_turn(env):
    item = unseen_ids("GoToRedBallGrey", 1)[0]
    turn = random_turns(env, item, 40, seed=3)
    again = random_turns(env, item, 40, seed=3)
    assert turn == again
    if turn is not None:  # cut just before that turn, the same player has not won
        assert random_turns(env, item, turn - 1, seed=3) is None


def test_the_command_prints_a_row_per_level_and_refuses_an_unknown_one(capsys):
    assert main(["GoToRedBallGrey", "Open", "--seeds", "2", "--limits", "2,6"]) == 0
    out = capsys.readouterr().out
    assert "| random within 2 | random within 6 |" in out
    assert out.count("| GoToRedBallGrey | 2 |") == 1 and out.count("| Open | 2 |") == 1
    with pytest.raises(SystemExit):
        main(["GoToRedBallGreen"])
    assert "unknown BabyAI level(s): GoToRedBallGreen" in capsys.readouterr().err
