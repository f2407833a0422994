"""The example family `guess` (environments/examples/guess), registered the way a user registers their own:
by naming its module in `env.families`, with no change to the built-in registry."""
from __future__ import annotations

import asyncio
import random

import pytest

from configs.fields import ConfigError
from configs.load import load_config
from environments.examples.guess import FAMILY, scripted_reply
from environments.examples.guess.env import GuessEnv, parse_guess, secret_for
from environments.item_sampler import family_items, family_of, mix_sampler
from environments.registry import get_family, make_env
from tests.training_runs import kill_group, read_jsonl, start, train_command

OURS = ["env.families={guess: environments.examples.guess}", "env.mix={guess: 1}"]


def run(coro):
    return asyncio.run(coro)


def test_a_guess_is_answered_and_the_right_one_ends_the_episode():
    env = GuessEnv(high=100)
    first = run(env.reset("guess_7"))
    assert "between 1 and 100" in first.text and "Action: guess <number>" in first.instruction
    secret = secret_for("guess_7", 100)
    low = run(env.step(f"Maybe {secret - 1}?")) if secret > 1 else None
    if low is not None:
        assert low.valid_action and low.parse_rule == "lenient" and not low.done and low.reward == 0.0
        assert low.observation == f"My number is higher than {secret - 1}."
    hit = run(env.step(f"Thought: I know it.\nAction: guess {secret}"))
    assert hit.done and hit.success and hit.parse_rule == "strict"
    assert hit.reward == (1.0 - 0.5 / env.max_guesses if low is not None else 1.0)


def test_bad_replies_change_nothing_and_cost_nothing():
    env = GuessEnv(high=10, parse_mode="strict")
    run(env.reset("guess_3"))
    for reply in ("", "I guess 5", "Action: guess 5\nAction: guess 6", "Action: guess 11", "Action: guess 0"):
        result = run(env.step(reply))
        assert not result.valid_action and not result.done and result.reward == 0.0 and result.observation
    assert env.guesses == 0
    assert parse_guess("no number here", "lenient") == (None, "none")
    assert parse_guess("between 3 and 9", "lenient") == (9, "lenient")


def test_items_are_deterministic_and_spread_over_the_range():
    secrets = [secret_for(f"guess_{n}", 100) for n in range(1000)]
    assert secrets == [secret_for(f"guess_{n}", 100) for n in range(1000)]
    assert min(secrets) == 1 and max(secrets) == 100 and len(set(secrets)) == 100
    with pytest.raises(ValueError, match="guess"):
        secret_for("babyai_3", 100)


def test_scripted_replies_are_valid_and_bisection_always_wins():
    rng = random.Random(0)
    for item in FAMILY.extras["contract_items"]:
        env = FAMILY.make_env({"high": 64})
        first = run(env.reset(item))
        latest = first.text
        for _ in range(FAMILY.reference_max_turns):
            result = run(env.step(scripted_reply(first.text + "\n" + latest, rng)))
            assert result.valid_action and result.parse_rule == "strict"
            if result.done:
                break
            latest = result.observation
    for n in range(200):  # a binary search finds any secret within max_guesses, at full or near-full reward
        env = GuessEnv(high=64)
        run(env.reset(f"guess_{n}"))
        low, high = 1, 64
        for _ in range(env.max_guesses):
            mid = (low + high) // 2
            result = run(env.step(f"Action: guess {mid}"))
            if result.done:
                break
            low, high = (mid + 1, high) if "higher" in result.observation else (low, mid - 1)
        assert result.success and result.reward > 0.5


def test_registered_by_config_options_reach_the_env(tmp_path):
    cfg = load_config(None, [*OURS, "env.options.guess={high: 7}"])
    env = make_env("guess", cfg.env)
    assert get_family("guess") is FAMILY
    assert "between 1 and 7" in run(env.reset("guess_1")).text
    assert family_of("guess_12", cfg.env) == "guess"
    train = family_items("guess", cfg.env, "train", cache_dir=str(tmp_path))
    test = family_items("guess", cfg.env, "test", cache_dir=str(tmp_path))
    assert len(train) == 800 and len(test) == 200 and not set(train) & set(test)
    sampler = mix_sampler(cfg.env, "train", seed=0, cache_dir=str(tmp_path))
    assert {sampler.next_item() for _ in range(50)} <= set(train)
    with pytest.raises(ValueError, match="unknown option"):
        make_env("guess", load_config(None, [*OURS, "env.options.guess={hihg: 7}"]).env)


@pytest.mark.parametrize("overrides, key", [
    (["env.mix={guess: 1}"], "env.mix.guess"),
    (["env.families={babyai: environments.examples.guess}"], "env.families.babyai"),
    (["env.families={guess: 'environments/examples/guess'}"], "env.families.guess"),
    (["env.options.guess={high: 7}"], "env.options.guess"),
])
def test_a_family_not_registered_is_refused_by_name(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.key == key


@pytest.mark.slow
def test_the_example_family_trains(tiny_model_dir, tmp_path):
    """Two real learner steps on the tiny model, every episode a guessing game."""
    out, log = tmp_path / "run", tmp_path / "train.log"
    proc = start(train_command(tiny_model_dir, out, *OURS, "trainer.total_steps=2", "eval.at_end=false",
                               "checkpoint.every_steps=0"), log)
    try:
        assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        kill_group(proc)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    trained = read_jsonl(out / "trained.jsonl")
    assert [r["step"] for r in trained] == [1, 2]
    started = {g["group_id"]: g["item_id"] for g in read_jsonl(out / "groups.jsonl")}
    groups = [g for r in trained for g in r["groups"]]
    assert len(groups) == 4 and all(started[g].startswith("guess_") for g in groups)
    assert read_jsonl(out / "metrics.jsonl")[-1]["env/guess/episodes"] >= 8


def test_launch_eval_accepts_a_family_of_the_config():
    from launch.eval.command import families_for

    assert families_for("guess", ("guess",)) == (["guess"], {})
    assert families_for("all", ("guess",))[0][-1] == "guess"
    with pytest.raises(ConfigError, match="unknown env 'guess'"):
        families_for("guess")
