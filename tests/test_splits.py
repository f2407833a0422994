"""Item splits: the dataset's files load as-is; otherwise deterministic generated splits, with a message."""
from __future__ import annotations

import json
import logging

import pytest

from configs.env import EnvConfig
from environments.item_sampler import family_items, family_of, mix_sampler
from environments.registry import get_family
from environments.splits import generate, load_split, read_split_file, split_path
from launch import splits as splits_cli


def test_dataset_files_load_as_is(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "eval").mkdir()
    ids = ["babyai_7", "babyai_3", "babyai_1234"]
    (tmp_path / "train" / "babyai_train.json").write_text(json.dumps([{"item_id": i, "extra": 1} for i in ids]))
    (tmp_path / "eval" / "babyai_test.json").write_text(json.dumps([{"item_id": "babyai_5"}]))
    assert load_split("babyai", "train", tmp_path, tmp_path / "cache") == ids  # order and ids kept
    assert load_split("babyai", "test", tmp_path, tmp_path / "cache") == ["babyai_5"]
    assert not (tmp_path / "cache").exists()


def test_malformed_files_fail_naming_the_file(tmp_path):
    path = tmp_path / "eval" / "textcraft_test.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"item_id": "textcraft_1"}, {"id": 3}]))
    with pytest.raises(ValueError, match="textcraft_test.json: entry 1"):
        read_split_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_split_file(path)


@pytest.mark.parametrize("name", ["babyai", "textcraft"])
def test_generated_splits_have_documented_sizes_and_are_disjoint(name):
    family = get_family(name)
    splits = generate(family)
    assert {k: len(v) for k, v in splits.items()} == family.split_sizes
    assert not set(splits["train"]) & set(splits["test"])
    assert splits == generate(family)
    assert all(0 <= int(i.rsplit("_", 1)[1]) < family.num_items for i in splits["train"] + splits["test"])


def test_missing_files_generate_into_the_cache_with_a_message(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.splits"):
        ids = load_split("textcraft", "test", tmp_path / "no-dataset", tmp_path / "cache")
    assert len(ids) == 100 and ids == generate(get_family("textcraft"))["test"]
    assert split_path(tmp_path / "cache", "textcraft", "test").is_file()
    assert "not found" in caplog.text and "generated deterministic splits" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentgym.splits"):
        assert load_split("textcraft", "test", "", tmp_path / "cache") == ids
    assert caplog.text == ""  # generated once, then read like the dataset's files


def test_splits_command_writes_the_dataset_layout(tmp_path, capsys):
    assert splits_cli.main(["--out", str(tmp_path), "--env", "babyai"]) == 0
    assert "generated deterministic splits" in capsys.readouterr().out
    assert len(read_split_file(tmp_path / "train" / "babyai_train.json")) == 810
    assert len(read_split_file(tmp_path / "eval" / "babyai_test.json")) == 90
    assert splits_cli.main(["--out", str(tmp_path), "--env", "agentgym_http"]) == 2


def test_item_sampler_follows_the_mix_and_level_filter(tmp_path):
    cfg = EnvConfig(mix={"babyai": 3.0, "textcraft": 1.0})
    cfg.babyai.levels = ["GoToRedBall", "PickupLoc"]
    sampler = mix_sampler(cfg, "train", seed=1, cache_dir=str(tmp_path))
    draws = [sampler.next_item() for _ in range(2000)]
    babyai = [d for d in draws if d.startswith("babyai_")]
    assert 0.70 < len(babyai) / len(draws) < 0.80
    assert {int(d.split("_")[1]) % 40 for d in babyai} == {1, 18}
    again = mix_sampler(cfg, "train", seed=1, cache_dir=str(tmp_path))
    assert [again.next_item() for _ in range(2000)] == draws


def test_http_items_route_to_the_http_family(tmp_path):
    cfg = EnvConfig(mix={"agentgym_http": 1.0})
    cfg.agentgym_http.task = "textcraft"
    items = family_items("agentgym_http", cfg, "test", cache_dir=str(tmp_path))
    assert len(items) == 100 and all(i.startswith("agentgym_http_") for i in items)
    assert family_of("agentgym_http_3", cfg) == "agentgym_http"
    assert family_of("textcraft_3", cfg) == "agentgym_http"  # the served task's id, no built-in textcraft in mix
    cfg.mix = {"textcraft": 1.0, "agentgym_http": 1.0}
    assert family_of("textcraft_3", cfg) == "textcraft"
    cfg.agentgym_http.task = "webshop"
    assert family_of("webshop_12", cfg) == "agentgym_http"
    with pytest.raises(ValueError, match="alfworld"):
        family_of("alfworld_1", cfg)


def test_generated_train_seeds_add_items_no_split_or_unseen_evaluation_holds(tmp_path):
    from environments.babyai import GENERATED_FIRST_SEED, unseen_items
    from environments.babyai.levels import level_and_seed

    cfg = EnvConfig(mix={"babyai": 1.0})
    cfg.babyai.levels = ["GoToRedBall", "PickupLoc"]
    split = family_items("babyai", cfg, "train", cache_dir=str(tmp_path))
    test = family_items("babyai", cfg, "test", cache_dir=str(tmp_path))
    cfg.babyai.generated_train_seeds = 5
    assert family_items("babyai", cfg, "test", cache_dir=str(tmp_path)) == test  # only training takes them
    train = family_items("babyai", cfg, "train", cache_dir=str(tmp_path))
    added = train[len(split):]
    assert train[:len(split)] == split and len(added) == 10
    assert {level_and_seed(i) for i in added} == {(lv, s) for lv in ("GoToRedBall", "PickupLoc")
                                                  for s in range(GENERATED_FIRST_SEED, GENERATED_FIRST_SEED + 5)}
    taken = set(split) | set(test)
    assert not set(added) & (taken | set(unseen_items(cfg.babyai, taken, 0)))
    sampler = mix_sampler(cfg, "train", seed=0, cache_dir=str(tmp_path))
    assert set(added) <= {sampler.next_item() for _ in range(20 * len(train))}  # they are drawn
    with pytest.raises(ValueError, match="eval.limit=4000"):  # unseen seeds would run into the generated ones
        unseen_items(cfg.babyai, taken, 4000)
