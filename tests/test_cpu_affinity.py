"""Pinning a process to cores, in a child process so that the test runner keeps its own affinity."""
from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from core.cpu_affinity import pin_to_cores


def _pin_and_report(cores, queue):
    try:
        pin_to_cores(cores, "learner.cpu_cores")
        queue.put(sorted(os.sched_getaffinity(0)))
    except ValueError as e:
        queue.put(str(e))


def _in_child(cores):
    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_pin_and_report, args=(cores, queue))
    proc.start()
    got = queue.get(timeout=60)
    proc.join(timeout=60)
    return got


def test_pins_to_the_given_cores_and_names_the_key_for_a_missing_one():
    first = min(os.sched_getaffinity(0))
    assert _in_child([first]) == [first]
    assert _in_child([]) == sorted(os.sched_getaffinity(0))
    error = _in_child([4096])
    assert isinstance(error, str) and error.startswith("learner.cpu_cores=[4096]")


def test_no_cores_leaves_this_process_alone():
    before = os.sched_getaffinity(0)
    pin_to_cores([], "env.cpu_cores")
    assert os.sched_getaffinity(0) == before
    with pytest.raises(ValueError, match="env.cpu_cores"):
        pin_to_cores([4096], "env.cpu_cores")
    assert os.sched_getaffinity(0) == before
