"""Transcripts a person can read: decoded from real episodes, written by every evaluation, sampled in training
within a size bound, and shown in the eval report as one success and one failure per level."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from actors.random_policy import RandomPolicy
from configs.load import load_config
from core.chat import ChatFormat
from core.codec import decode, encode
from core.env import SyncEnv, run_sync_env
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.trajectory import WireError
from core.transcript import as_text, episode_record
from environments.babyai.env import BabyAIEnv
from launch.job.episodes import TrainingEpisodes, pick_sample, write_eval_episodes
from tests.training_runs import ROOT, TINY_RECIPE


class Recording(SyncEnv):
    """The real BabyAI env, remembering every observation it sent and every action it parsed."""
    family = "babyai"

    def __init__(self):
        self.inner = BabyAIEnv(parse_mode="lenient")
        self.observations: list[str] = []
        self.actions: list[str] = []

    def reset(self, item_id):
        obs = self.inner.reset(item_id)
        self.observations.append(obs.text)
        return obs

    def step(self, reply):
        result = self.inner.step(reply)
        self.observations.append(result.observation)
        self.actions.append(result.info.get("action", ""))
        return result


def _episode(tiny_model_dir, tiny_tokenizer, item: str, horizon: int):
    env = Recording()
    policy = RandomPolicy(str(tiny_model_dir), load_config(None, []).env)
    spec = EpisodeSpec(f"eval-{item}.s0", item, f"eval-{item}", 0, horizon)
    limits = EpisodeLimits(max_tokens_per_turn=64, max_context_tokens=4096, temperature=0.0)
    traj = asyncio.run(run_episode(run_sync_env(env), policy, ChatFormat(tiny_tokenizer), spec, limits))
    return traj, env


def test_a_transcript_holds_each_turn_as_the_env_and_the_agent_saw_it(tiny_model_dir, tiny_tokenizer):
    traj, env = _episode(tiny_model_dir, tiny_tokenizer, "babyai_0", horizon=4)  # GoToRedBallGrey, seed 0
    assert traj.num_turns >= 2 and traj.turn_actions == env.actions
    record = episode_record(traj, ChatFormat(tiny_tokenizer), policy="random", label="GoToRedBallGrey",
                            max_chars=0)  # nothing cut
    assert record["item_id"] == "babyai_0" and record["policy"] == "random" and record["horizon"] == 4
    assert record["ended"] == ("success" if traj.metrics["success"] else traj.termination.value)
    assert len(record["turns"]) == traj.num_turns
    for k, turn in enumerate(record["turns"]):
        assert turn["observation"] == env.observations[k]  # the env's own text, without the template's markup
        assert turn["reply"] == f"Action:\n{env.actions[k]}"  # what the random policy wrote
        assert turn["action"] == env.actions[k] and turn["reward"] == pytest.approx(float(traj.turn_rewards[k]))
    cut = episode_record(traj, ChatFormat(tiny_tokenizer), policy="random", max_chars=200)
    longest = max(len(o) for o in env.observations[:traj.num_turns])
    assert longest > 300 and max(len(t["observation"]) for t in cut["turns"]) < 240  # the bound holds
    assert "chars ...]" in cut["turns"][0]["observation"] and cut["level"] == "babyai"
    text = as_text(record, max_chars=80)
    assert "babyai_0" in text and f"action: {env.actions[0]!r}" in text and "ended:" in text
    # The actions travel on the wire with the record, and a record that breaks their invariant is refused.
    assert decode(encode(traj)).turn_actions == env.actions
    traj.turn_actions = env.actions[:-1]
    with pytest.raises(WireError, match="turn_actions"):
        traj.validate()
    traj.turn_actions = ["x" * 300] + env.actions[1:]
    with pytest.raises(WireError, match="turn_actions"):
        traj.validate()


def test_a_rerun_replaces_only_its_own_lines(tmp_path):
    rec = lambda policy, horizon, n: {"policy": policy, "env": "babyai", "horizon": horizon, "n": n}  # noqa: E731
    write_eval_episodes(tmp_path, [rec("model", 4, 1), rec("model", 4, 2)], "model", "babyai", 4)
    write_eval_episodes(tmp_path, [rec("model", 20, 3)], "model", "babyai", 20)
    write_eval_episodes(tmp_path, [rec("model", 4, 4)], "model", "babyai", 4)  # the 4-turn eval again
    lines = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["n"] for r in lines) == [3, 4]


def test_the_training_sample_is_bounded_and_mixes_successes_and_failures(tiny_model_dir, tiny_tokenizer, tmp_path):
    trajs = [_episode(tiny_model_dir, tiny_tokenizer, f"babyai_{2 + 40 * s}", horizon=3)[0] for s in range(8)]
    wins = [bool(t.metrics["success"]) for t in trajs]
    assert any(wins) and not all(wins)  # GoToRedBallNoDists at 3 turns: the random policy wins some
    picked = pick_sample(trajs, 3)
    assert [bool(t.metrics["success"]) for t in picked] == [False, True, False]

    class Table:  # stands in for the wandb run: what the session's sink receives
        logged: list = []

        def log_episodes(self, step, records):
            self.logged.append((step, records))

    path = tmp_path / "episodes.jsonl"
    one = len(json.dumps(episode_record(trajs[0], ChatFormat(tiny_tokenizer), policy="model"))) + 1
    sink = Table()
    sample = TrainingEpisodes(path, str(tiny_model_dir), every=2, per_sample=2, max_mb=5.5 * one / (1 << 20),
                              wandb=sink)
    kept = [sample.keep(step, trajs) for step in range(1, 9)]
    assert kept[0] == {} and kept[1]["episodes/kept"] == 2.0  # steps 2, 4, 6, 8 are due
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.stat().st_size <= 5.5 * one * 1.3  # the cap holds (episodes differ a little in length)
    assert 2 <= len(lines) < 8 and kept[-1]["episodes/skipped"] == 8 - len(lines)
    assert {r["step"] for r in lines} <= {2, 4, 6} and all(r["policy"] == "model" for r in lines)
    assert [s for s, _ in sink.logged] == sorted({r["step"] for r in lines})
    for field in ("item_id", "level", "ended", "turns", "horizon", "reward"):
        assert field in lines[0]
    assert set(lines[0]["turns"][0]) == {"observation", "reply", "action", "reward"}


def test_wandb_takes_the_sample_as_a_table(tmp_path, tiny_model_dir, tiny_tokenizer):
    from launch.job.wandb_sink import WandbSink

    traj, _ = _episode(tiny_model_dir, tiny_tokenizer, "babyai_2", horizon=2)
    record = {**episode_record(traj, ChatFormat(tiny_tokenizer), policy="model"), "step": 3}
    sink = WandbSink("offline", "test", "episodes", tmp_path, {})
    try:
        sink.log_episodes(3, [record])
    finally:
        sink.close()
    tables = list(tmp_path.rglob("episodes_*.table.json"))
    assert tables, sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))[:40]
    table = json.loads(tables[0].read_text())
    assert table["columns"][:3] == ["step", "item_id", "level"] and table["data"][0][1] == "babyai_2"


@pytest.mark.slow
def test_an_evaluation_writes_every_episode_and_its_report_shows_a_success_and_a_failure_per_level(
        tiny_model_dir, tmp_path):
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "launch.eval", "--policy", "random", "--env", "babyai", "--config",
           str(TINY_RECIPE), "--model", str(tiny_model_dir), "--items", "unseen", "--samples", "4", "--out", str(out),
           "eval.limit=4", "eval.max_turns=4", "env.babyai.levels=[GoToRedBallNoDists,GoToObjS6]",
           "logging.progress_bar=false", "ray.num_cpus=2"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == 16  # 4 unseen items (2 per level) x 4 samples
    levels = {"GoToRedBallNoDists", "GoToObjS6"}  # where a random choice wins about half its episodes
    assert {r["level"] for r in lines} == levels and {r["policy"] for r in lines} == {"random"}
    for r in lines:
        assert r["horizon"] == 4 and r["ended"] in ("success", "failure", "horizon", "context_limit")
        assert 1 <= len(r["turns"]) == r["num_turns"] <= 4
        assert all(t["action"] and t["reply"] == f"Action:\n{t['action']}" and t["observation"] for t in r["turns"])
    for level in levels:
        ends = {r["ended"] for r in lines if r["level"] == level}
        assert "success" in ends and ends - {"success"}, (level, ends)
    md = (out / "eval_report.md").read_text()
    assert "## babyai: one success and one failure per level (random)" in md
    for level in levels:
        section = md.split(f"### {level}\n")[1].split("###")[0]
        assert "A success:" in section and "A failure:" in section and section.count("```text") == 2, section
        assert "ended: success" in section
    report = json.loads((out / "eval_report.json").read_text())
    assert set(report["rows"]["random"][0]["examples"]) == levels
