"""The driver's filter on the raylet's repeated warnings (`launch.job.ray_log_filter`). The end-to-end case, a real
raylet warning every 10 s through a training run, is in tests/test_quiet_terminal.py; these pin the rules with
a clock the test moves."""
from __future__ import annotations

import pytest

from launch.job.ray_log_filter import RepeatFilter


def disk_line(second: int, free_gb: float) -> str:
    return (f"[2026-12-05 17:35:{second:02d},789 E 29397 29411] (raylet) file_system_monitor.cc:116: "
            f"/tmp/ray/session_2026-12-05_17-35-25_356817_29326 is over 95% full, available space: {free_gb} GB")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_raylet_warning_shows_once_then_again_with_its_count_after_the_interval():
    clock = Clock()
    thin = RepeatFilter(every_s=60, clock=clock)
    first = thin({"pid": "raylet", "ip": "127.0.0.1", "lines": [disk_line(36, 7.92734)]})
    assert first["lines"] == [disk_line(36, 7.92734)] and first["ip"] == "127.0.0.1"
    for step in range(1, 6):  # every 10 s, sizes and timestamps differ: still the same warning
        clock.now = 10.0 * step
        assert thin({"pid": "raylet", "lines": [disk_line(36 + step, 7.9 - step / 100)]}) is None
    clock.now = 60.0
    again = thin({"pid": "raylet", "lines": [disk_line(42, 7.85)]})["lines"]
    assert again == [disk_line(42, 7.85) + " [and 5 more like it since 1 min ago]"]
    clock.now = 70.0
    assert thin({"pid": "raylet", "lines": [disk_line(52, 7.85)]}) is None  # the count starts again


def test_other_raylet_lines_and_worker_lines_pass_as_they_are():
    thin = RepeatFilter(every_s=600, clock=Clock())
    other = "[2026-12-05 17:35:40,001 E 1 2] (raylet) node_manager.cc:9: a worker died"
    batch = thin({"pid": "raylet", "lines": [disk_line(1, 7.0), other, disk_line(2, 7.0)]})
    assert batch["lines"] == [disk_line(1, 7.0), other]
    worker = {"pid": 4242, "lines": ["step 1", "step 1", "step 1"]}
    assert thin(worker) is worker


def test_a_bad_interval_is_refused():
    with pytest.raises(ValueError, match="every_s must be > 0, got 0"):
        RepeatFilter(every_s=0)
