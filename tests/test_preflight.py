"""Failing at start, not per episode: a family that cannot run here stops the run before any role starts
(exit 2, naming what is missing), and a run whose episodes keep failing in the env stops, naming the family."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actors.episode_watch import EpisodesFailing, EpisodeWatch
from configs.load import load_config
from environments.item_sampler import family_items
from environments.preflight import preflight
from tests.training_runs import ROOT

SITES = ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA", "HOMEPAGE")


def test_webarena_without_site_urls_exits_2_at_start_naming_the_variables():
    env = {k: v for k, v in os.environ.items() if k not in SITES}
    proc = subprocess.run([sys.executable, "-m", "launch.train", "env.mix={webarena: 1}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    for var in ("GITLAB", "MAP", "REDDIT", "SHOPPING", "SHOPPING_ADMIN"):
        assert f"{var} (" in proc.stderr
    assert "env.webarena.storage_state_dir" in proc.stderr and "env.webarena.tasks=local_shop" in proc.stderr
    assert "Ray" not in proc.stdout + proc.stderr  # refused before anything started


def test_a_set_site_url_is_not_reported(monkeypatch):
    for var in SITES:
        monkeypatch.setenv(var, f"http://127.0.0.1:9/{var.lower()}")
    cfg = load_config(None, ["env.mix={webarena: 1}", "env.webarena.storage_state_dir=/tmp"])
    assert preflight(cfg.env, ["train", "test"]) == []


def test_the_local_shop_needs_nothing_and_never_draws_a_skipped_task(monkeypatch):
    monkeypatch.delenv("SHOPPING", raising=False)
    cfg = load_config(None, ["env.mix={webarena: 1}", "env.webarena.tasks=local_shop"])
    assert preflight(cfg.env, ["train", "test"]) == []
    items = family_items("webarena", cfg.env, "train")
    assert items == family_items("webarena", cfg.env, "test")
    assert "webarena_812" in items and "webarena_817" not in items  # 817 needs a fuzzy_match judge
    judged = load_config(None, ["env.mix={webarena: 1}", "env.webarena.tasks=local_shop",
                                "env.webarena.judge_url=http://127.0.0.1:9/v1"])
    assert "webarena_817" in family_items("webarena", judged.env, "train")


def test_sciworld_without_java_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java
    problems = preflight(load_config(None, ["env.mix={sciworld: 1, babyai: 1}"]).env, ["train"])
    assert len(problems) == 1 and problems[0].startswith("env.mix.sciworld:") and "java" in problems[0]


@pytest.mark.parametrize("overrides, needle", [
    (["env.searchqa.retriever=remote"], "env.searchqa.retriever_url"),
    (["env.searchqa.corpus_dir=/nonexistent/corpus"], "env.searchqa.corpus_dir: no folder at /nonexistent/corpus"),
    (["env.babyai.levels=[NoSuchLevel]"], "env.mix.babyai: env.babyai.levels: unknown level(s) NoSuchLevel"),
])
def test_other_families_name_what_is_missing(overrides, needle):
    mix = "env.mix={babyai: 1}" if overrides[0].startswith("env.babyai") else "env.mix={searchqa: 1}"
    problems = preflight(load_config(None, [mix, *overrides]).env, ["train"])
    assert any(needle in p for p in problems), problems


def test_the_episode_watch_stops_a_family_that_keeps_failing():
    watch = EpisodeWatch(window=8, max_frac=0.5)
    for _ in range(7):
        watch.record("webarena", "env_error")  # the window is not full yet
    for _ in range(20):
        watch.record("babyai", "env_error" if _ % 2 else "done")  # exactly half: allowed
    with pytest.raises(EpisodesFailing, match=r"the webarena env keeps failing: of its last 8 episodes, 8 env_error"):
        watch.record("webarena", "env_error")


def test_the_episode_watch_forgets_old_failures():
    watch = EpisodeWatch(window=4, max_frac=0.5)
    for t in ["done", "env_error", "done", "env_timeout", "done", "horizon", "env_error", "done"]:
        watch.record("textcraft", t)  # never more than 2 of the last 4
    with pytest.raises(EpisodesFailing, match="1 env_error, 2 env_timeout"):
        for t in ["env_timeout", "env_timeout"]:
            watch.record("textcraft", t)


def test_the_episode_watch_names_a_generator_that_fails_every_request():
    watch = EpisodeWatch(window=4, max_frac=0.5)
    with pytest.raises(EpisodesFailing, match="policy's generation for the babyai env keeps failing.*3 aborted"):
        for t in ["done", "aborted", "aborted", "aborted"]:
            watch.record("babyai", t)
