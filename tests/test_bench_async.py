"""The async benchmark's runs are valid configs that differ only in what their mode names, the long tail is dealt
from a stratified deck, the headline is the whole run (step 1 and the drain included) over seeds with its bounds,
and it refuses to compare runs that trained different tokens (the bench itself runs six training jobs: too long
for the suite)."""
from __future__ import annotations

import importlib

import pytest

from configs.load import load_config

bench = importlib.import_module("launch.bench.async")
ARGS = bench.argparse.Namespace(model="default", blocks=1, groups=2, group_size=4, turns=3, tokens_per_turn=32,
                                eta=4, lr=1e-9, cores="0,1", autocast="none",
                                on_weight_update="abort", scheduling="priority", max_num_seqs=12,
                                kv_cache_max_age=3, sync_groups=0, sync_max_num_seqs=0, batch_order="submission")


def configs(workload, tmp_path):
    return {m: load_config(None, bench.overrides(ARGS, m, workload, tmp_path / "run", seed=5)) for m in bench.MODES}


def test_the_runs_are_valid_configs_differing_only_in_their_mode(tmp_path):
    cfgs = configs("fixed", tmp_path)
    pinned, colocated, run_async = cfgs["sync_pinned"], cfgs["sync_colocated"], cfgs["async"]
    assert [c.trainer.max_staleness for c in (colocated, pinned, run_async)] == [0, 0, 4]
    assert pinned.learner.cpu_cores == [1] and pinned.generator.cpu_threads_bind == "0"
    assert pinned.generator.cpu_cores == pinned.env.cpu_cores == [0]
    assert colocated.generator.cpu_threads_bind == "0,1" and colocated.learner.cpu_cores == [0, 1]
    assert colocated.learner.torch_threads == 2 and colocated.generator.cpu_cores == [0, 1]
    for c in cfgs.values():  # the same work: fixed reply lengths, the same items, batches in start order
        assert c.rollout.min_tokens_per_turn == c.rollout.max_tokens_per_turn == 32
        assert c.trainer.batch_order == "submission" and c.env.mix == {"workload": 1}
        assert c.algorithm.rounds_ctrl.type == "fixed" and c.algorithm.rounds_ctrl.rounds == 3
        assert c.learner.cpu_autocast == "none"  # --autocast, the same in every mode
        assert c.generator.on_weight_update == "abort"  # --on-weight-update, the same in every mode
        assert c.generator.scheduling == "priority"  # the same in every mode
    # --max-num-seqs caps the async run's seats; a sync step's 8 episodes keep the config's (64) to decode together
    assert run_async.generator.max_num_seqs == 12
    assert pinned.generator.max_num_seqs == colocated.generator.max_num_seqs == 64
    # --kv-cache-max-age: the async run's (at most eta); eta 0 allows the sync runs none
    assert run_async.generator.kv_cache_max_age == 3
    assert pinned.generator.kv_cache_max_age == colocated.generator.kv_cache_max_age == 0
    run_async.trainer.max_staleness = 0
    run_async.generator.max_num_seqs = 64
    run_async.generator.kv_cache_max_age = 0
    assert run_async == pinned
    tail = configs("longtail", tmp_path)["async"]
    assert tail.env.options["workload"] == {"turns": 1, "long_tail": True, "seed": 5}
    assert tail.algorithm.rounds_ctrl.rounds == 16 and tail.trainer.seed == 5 and tail.trainer.total_steps == 8


def test_the_synchronous_baseline_takes_its_own_batch_and_seats_over_the_same_groups(tmp_path):
    args = bench.argparse.Namespace(**{**vars(ARGS), "blocks": 2, "sync_groups": 4, "sync_max_num_seqs": 16})
    cfgs = {m: load_config(None, bench.overrides(args, m, "longtail", tmp_path / m, seed=1)) for m in bench.MODES}
    assert [cfgs[m].trainer.groups_per_step * cfgs[m].trainer.total_steps for m in bench.MODES] == [32, 32, 32]
    assert cfgs["sync_colocated"].trainer.groups_per_step == 4 and cfgs["async"].trainer.groups_per_step == 2
    assert cfgs["sync_colocated"].generator.max_num_seqs == 16 and cfgs["async"].generator.max_num_seqs == 12


def test_completion_order_batches_are_checked_for_equal_tokens_over_the_whole_run(tmp_path):
    args = bench.argparse.Namespace(**{**vars(ARGS), "batch_order": "completion"})
    cfgs = {m: load_config(None, bench.overrides(args, m, "longtail", tmp_path / m, seed=1)) for m in bench.MODES}
    assert {c.trainer.batch_order for c in cfgs.values()} == {"completion"}
    step = "train/batch_tokens"
    runs = {"sync_colocated": [{step: 100.0}, {step: 300.0}], "async": [{step: 300.0}, {step: 100.0}]}
    assert bench.check_tokens(args, runs, seed=1, workload="longtail") == 0.0  # the same groups, another order
    with pytest.raises(SystemExit, match="did not train the same tokens"):
        bench.check_tokens(ARGS, runs, seed=1, workload="longtail")  # start order: checked step by step
    with pytest.raises(SystemExit, match="did not train the same tokens"):
        bench.check_tokens(args, {**runs, "async": [{step: 300.0}, {step: 50.0}]}, seed=1, workload="longtail")


def test_summary_skips_the_first_step_and_the_drain_and_splits_wait_from_training():
    rows = [{"perf/step_seconds": 100.0, "perf/learner_idle_frac": 0.9, "perf/train_seconds": 5.0,
             "perf/publish_seconds": 1.0, "train/batch_tokens": 10.0, "train/staleness/0": 1.0}]
    rows += [{"perf/step_seconds": s, "perf/learner_idle_frac": w / s, "perf/train_seconds": s - w - 1.0,
              "perf/publish_seconds": 1.0, "train/batch_tokens": 800.0, "train/staleness/0": 0.5}
             for s, w in ((40.0, 10.0), (60.0, 30.0), (20.0, 0.0))]  # the last: the drain, trained alone
    rows[-1].update({"perf/generator0/prompt_tokens": 900.0, "perf/generator0/cached_prompt_tokens": 700.0,
                     "perf/generator1/prompt_tokens": 100.0, "perf/generator1/cached_prompt_tokens": 0.0})
    got = bench.summarise(rows, drain=1)
    assert got["prefill_tokens"] == 300.0  # computed, not cached, over every replica
    assert got["step_s"] == pytest.approx(50.0) and got["wait_s"] == pytest.approx(20.0)
    assert got["train_s"] == pytest.approx(30.0) and got["stale_frac"] == pytest.approx(0.5)
    assert got["whole_run_step_s"] == pytest.approx(40.0)  # (40 + 60 + 20) / 3
    assert got["step_tokens"] == [800.0, 800.0, 800.0]  # the same work is checked on every step after the first
    assert got["timed_steps"] == (2, 3)  # steps 2 and 3 of 4: after the first, before the drain's one
    with pytest.raises(SystemExit, match="leave none"):
        bench.summarise(rows[:2], drain=1)


def test_token_check():
    same = {"step_s": 10.0, "wait_s": 6.0, "train_s": 4.0, "step_tokens": [1000.0, 2000.0], "whole_run_step_s": 9.0}
    results = {"sync_colocated": {**same, "step_s": 8.0}, "sync_pinned": same,
               "async": {**same, "step_s": 5.0, "step_tokens": [1000.0, 2005.0]}}
    gap, where = bench.token_mismatch(results)
    assert gap == pytest.approx(5 / 2005) and "timed step 2" in where
    results["async"]["step_tokens"] = [1000.0, 2100.0]
    assert bench.token_mismatch(results)[0] > bench.TOKEN_TOLERANCE


def test_the_tune_seed_and_too_few_seeds_are_refused_before_any_run(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1,2,3", "--tune-seed", "2", "--keep", "/nonexistent/never-created"])
    assert "--tune-seed 2 is among --seeds 1,2,3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1,2", "--keep", "/nonexistent/never-created"])
    assert "at least 3 distinct seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--sync-groups", "3"])  # 3 does not divide the 32 groups of two blocks
    assert "--sync-groups 3 must divide the 32 groups" in capsys.readouterr().err


def test_a_kv_cache_older_than_eta_is_refused_before_any_run(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--eta", "2", "--kv-cache-max-age", "3", "--keep", "/nonexistent/never-created"])
    assert exit_.value.code == 2 and "--kv-cache-max-age: 0 to --eta (2), got 3" in capsys.readouterr().err


def test_reuse_reads_back_a_finished_run_with_the_same_command_and_runs_any_other(tmp_path, monkeypatch):
    args = bench.argparse.Namespace(**vars(ARGS), reuse=True, timeout_s=60)
    out = tmp_path / "async_fixed_seed0"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    cmd = [bench.sys.executable, "-m", "launch.train", *bench.overrides(args, "async", "fixed", out, 0)]
    record = tmp_path / "async_fixed_seed0.command.json"
    record.write_text(bench.json.dumps({"command": cmd[1:], "commit": bench.commit()}))
    ran, real_run = [], bench.subprocess.run

    def run(argv, **kwargs):  # git still answers; a training run is recorded and refused
        if argv[0] == "git":
            return real_run(argv, **kwargs)
        ran.append(argv)
        raise OSError("no training run in this test")

    monkeypatch.setattr(bench.subprocess, "run", run)
    assert bench.run_mode(args, "async", "fixed", tmp_path) == [{"step": 1}, {"step": 2}] and not ran
    args.eta = 3  # another command: the kept run is dropped and the mode runs again
    with pytest.raises(OSError):
        bench.run_mode(args, "async", "fixed", tmp_path)
    assert ran and not record.exists() and not out.exists()


def test_the_tail_of_the_timed_window_is_read_from_the_runs_lineage(tmp_path):
    """The window's groups counted by their item's turns, as the workload draws them; steps outside it are not."""
    from environments.examples.workload import turns_for
    from launch.bench.tail import describe, expected_turns, window_turns

    by_turns: dict[int, list[str]] = {}
    for n in range(200):
        by_turns.setdefault(turns_for(f"workload_{n}", 1, True), []).append(f"workload_{n}")
    assert sorted(by_turns) == [1, 2, 4, 8, 16]
    steps = {1: [by_turns[16][0], by_turns[1][0]], 2: [by_turns[16][1], by_turns[8][0]],
             3: [by_turns[2][0], by_turns[2][1]], 4: [by_turns[16][2], by_turns[4][0]]}
    groups, trained = [], []
    for step, items in steps.items():
        ids = [f"g{step}{i}-{item}" for i, item in enumerate(items)]
        groups += [bench.json.dumps({"group_id": g, "item_id": item}) for g, item in zip(ids, items)]
        trained.append(bench.json.dumps({"step": step, "groups": ids}))
    (tmp_path / "groups.jsonl").write_text("\n".join(groups) + "\n")
    (tmp_path / "trained.jsonl").write_text("\n".join(trained) + "\n")
    assert window_turns(tmp_path, 2, 3) == {1: 0, 2: 2, 4: 0, 8: 1, 16: 1}
    assert window_turns(tmp_path, 1, 4) == {1: 1, 2: 2, 4: 1, 8: 1, 16: 3}
    assert expected_turns(16) == {1: 8, 2: 4, 4: 2, 8: 1, 16: 1}
    assert describe({1: 0, 2: 2, 4: 0, 8: 1, 16: 1}, 2, 3) == (
        "the timed steps 2-3 trained 4 groups of 1, 2, 4, 8, 16 turns: 0, 2, 0, 1, 1 "
        "(the tail's weights give 2, 1, 0.5, 0.25, 0.25)")
    (tmp_path / "groups.jsonl").write_text(groups[0] + "\n")  # a lineage missing a group is refused, not skipped
    with pytest.raises(ValueError, match="groups.jsonl lacks"):
        window_turns(tmp_path, 2, 3)


def test_every_block_of_16_dealt_groups_holds_exactly_the_tails_shares():
    """The deck, for several seeds and blocks, as the run deals it: the sampler takes the train split in id order,
    so the n-th group a run starts is workload_n, and each 16 in a row from the first hold 8/4/2/1/1 groups of
    1/2/4/8/16 turns; the order is a pure function of (seed, block) and differs between seeds."""
    from collections import Counter

    from configs.env import EnvConfig
    from environments.examples.workload import deck_block, turns_for
    from environments.item_sampler import mix_sampler

    shares = {1: 8, 2: 4, 4: 2, 8: 1, 16: 1}
    for seed in (0, 1, 2, 7, 12345):
        cfg = EnvConfig(families={"workload": "environments.examples.workload"}, mix={"workload": 1.0},
                        options={"workload": {"turns": 1, "long_tail": True, "seed": seed}})
        sampler = mix_sampler(cfg, "train", seed=seed)
        dealt = [sampler.next_item() for _ in range(16 * 12)]
        assert dealt[:3] == ["workload_0", "workload_1", "workload_2"]
        for block in range(12):
            turns = [turns_for(item, 1, True, seed) for item in dealt[16 * block:16 * (block + 1)]]
            assert Counter(turns) == shares, (seed, block)
            assert deck_block(seed, block) == deck_block(seed, block)  # pure: the same again
        assert Counter(turns_for(f"workload_{n}", 3, True, seed) for n in range(48, 64)) == \
            {3 * t: k for t, k in shares.items()}  # `turns` scales the cards
    assert deck_block(1, 0) != deck_block(2, 0) or deck_block(1, 1) != deck_block(2, 1)


def whole_run_files(step_seconds, waits, first_admit=1000.0):
    """Synthetic per-step rows and lineage of one run: the learner waits, then trains 2 s and publishes 1 s."""
    rows, trained, now = [], [], first_admit
    for i, (step_s, wait) in enumerate(zip(step_seconds, waits)):
        now += step_s
        rows.append({"perf/step_seconds": step_s, "perf/learner_idle_frac": wait / step_s, "perf/train_seconds": 2.0,
                     "perf/publish_seconds": 1.0, "train/batch_tokens": 100.0,
                     "perf/generator0/busy_frac": 0.5})
        trained.append({"step": i + 1, "time": now})
    groups = [{"group_id": f"g{i}", "time": first_admit + i} for i in range(4)]
    return rows, groups, trained


def test_the_headline_is_the_whole_run_step_1_and_drain_included_with_bounds():
    from launch.bench import wholerun

    # step 1 (60 s, warm-up) and the drain (the last 40 s step) are where async loses: they count
    sync = wholerun.record(*whole_run_files([50.0, 20.0, 20.0, 20.0], [47.0, 17.0, 17.0, 17.0]))
    run_async = wholerun.record(*whole_run_files([60.0, 5.0, 5.0, 40.0], [57.0, 2.0, 2.0, 37.0]))
    assert sync["wall_s"] == 110.0 and run_async["wall_s"] == 110.0  # first admission to the last trained step
    assert run_async["learner_s"] == 12.0 and run_async["critical_s"] == 57.0 + 12.0
    assert run_async["gen_busy_s"] == 0.5 * 110.0
    per_seed = {1: wholerun.seed_figures(sync, run_async)}
    assert per_seed[1]["ratio"] == 1.0  # the steady window (steps 2-3) alone would say 20 / 5 = 4
    assert per_seed[1]["learner_bound"] == 110.0 / 12.0 and per_seed[1]["critical_path_bound"] == 110.0 / 69.0
    assert per_seed[1]["above_bound"] == []
    quick = wholerun.record(*whole_run_files([10.0, 5.0, 5.0, 5.0], [7.0, 2.0, 2.0, 2.0]))
    per_seed[2] = wholerun.seed_figures(sync, quick)
    per_seed[3] = wholerun.seed_figures(sync, {**quick, "wall_s": 10.0})  # shorter than its generator was busy
    assert per_seed[3]["above_bound"] == ["generation", "learner", "critical_path"]
    figures, lines = wholerun.headline(per_seed, "async_over_sync_colocated_longtail_wholerun")
    assert figures["async_over_sync_colocated_longtail_wholerun"] == pytest.approx(110.0 / 25.0)  # the median
    assert figures["async_over_sync_colocated_longtail_wholerun_min"] == 1.0
    assert figures["async_over_sync_colocated_longtail_wholerun_max"] == 110.0 / 10.0
    assert figures["async_over_sync_colocated_longtail_wholerun_bench_bug"] is True
    assert len(lines) == 4 and "BENCH BUG: above the generation, learner, critical_path bound" in lines[2]
    assert "bound" not in lines[0].split(")")[-1]  # no flag on a run within its bounds
    with pytest.raises(ValueError, match="must carry a `time`"):
        wholerun.record(*whole_run_files([1.0], [0.5])[:2], [{"step": 1}])
