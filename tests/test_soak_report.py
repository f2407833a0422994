"""The soak report tells a flat run from one whose memory grows or whose tokens/s falls, after warm-up, from the
per-step role series a run logs (synthetic metrics.jsonl rows here: a real soak is 100+ steps of minutes each)."""
from __future__ import annotations

import json

import pytest

from launch import soak_report


def rows(steps: int, rss=lambda s: 2048.0, rate=lambda s: 100.0) -> list[dict]:
    out = []
    for s in range(1, steps + 1):
        noise = 1.0 + (0.08 if s % 3 == 0 else -0.05 if s % 3 == 1 else 0.0)  # per-step swings, no trend
        out.append({"step": s, "perf/rss_mb/learner0": rss(s), "perf/rss_mb/driver": 500.0,
                    "perf/train_tokens_per_s": rate(s) * noise, "perf/generator0/tokens_per_s": 40.0 * noise})
    return out


def test_a_flat_run_is_flat_and_a_leak_or_a_slowdown_is_not(tmp_path):
    warm = lambda s: 6000.0 if s <= 10 else 2048.0  # warm-up may be anything: it is left out  # noqa: E731
    flat = soak_report.report(rows(100, rss=warm), warmup=10, window=5, band=0.15)
    assert flat["soak_flat"] and set(flat["series"]) == {"perf/rss_mb/learner0", "perf/rss_mb/driver",
                                                         "perf/train_tokens_per_s", "perf/generator0/tokens_per_s"}
    assert flat["series"]["perf/train_tokens_per_s"]["raw_max_dev"] > 0.05  # the raw swings are shown
    leak = soak_report.report(rows(100, rss=lambda s: 2048.0 + 20.0 * s), warmup=10, window=5, band=0.15)
    assert not leak["soak_flat"] and not leak["series"]["perf/rss_mb/learner0"]["flat"]
    assert leak["series"]["perf/rss_mb/learner0"]["max_dev"] > 0.5
    slow = soak_report.report(rows(100, rate=lambda s: 170.0 if s < 40 else 75.0), warmup=10, window=5, band=0.15)
    assert not slow["series"]["perf/train_tokens_per_s"]["flat"] and slow["series"]["perf/rss_mb/learner0"]["flat"]
    with pytest.raises(ValueError, match="need at least 10"):
        soak_report.report(rows(15), warmup=10, window=5, band=0.15)


def test_the_command_writes_the_plot_and_a_json_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows(40)) + "\n")
    assert soak_report.main([str(tmp_path), "--warmup", "5"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["soak_flat"] is True
    assert (tmp_path / "soak.png").stat().st_size > 0
