"""Shared fixtures, and how the suite is spread over workers. Network rule: tests talk only to 127.0.0.1 (or
namespaces they create themselves).

The suite runs on pytest-xdist workers (`-n auto --dist loadfile` in pyproject.toml): a test module runs whole
on one worker, so its module fixtures (a vLLM engine, a two-node cluster) are made once. A serial run keeps
2 cores only half busy (52 % measured): its time goes to waiting on the processes a run starts (Ray, the
engine, the learner, the env pools). Two workers on 2 cores still left 12 % idle; a worker per core plus one
fills it. Modules holding a `slow` test are handed out first, so that no long one is left for the end while
the other workers idle.
"""
from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# RAY_AUTH_MODE is left to launch.job.ray_cluster, as in a run: a local Ray checks a token held in the environment.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


GIB_PER_WORKER = 6  # an end-to-end test's run holds a local Ray, a vLLM engine, a learner and env pools
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core plus one (the suite waits on processes about half the time), at most
    MAX_WORKERS, and no more than the memory holds runs."""
    cores = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (GIB_PER_WORKER << 30)
    return max(1, min(cores + 1, MAX_WORKERS, memory))


def pytest_collection_modifyitems(config, items) -> None:
    """Modules with a `slow` test first (longest-first spreads the work best), each module's tests kept together
    and in order; the rest after them in collection order."""
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow)  # a stable sort: order within each kept


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """A test that fails before closing its ZeroMQ sockets leaves them open, and the finalizer of their context
    (run by the collection at pytest's exit) can wait for them forever: seen once, a failed
    test_weights_integrity run hung in pytest_unconfigure -> gc -> Context.__del__ -> term. Close what is left
    without lingering first (pyzmq's own garbage-collector context excepted: its thread closes it)."""
    import gc

    import zmq
    from zmq.utils.garbage import gc as zmq_gc

    for obj in gc.get_objects():
        # type(), not isinstance: isinstance reads __class__, which warns on torch's deprecated lazy attributes
        if issubclass(type(obj), zmq.Context) and obj is not zmq_gc._context and not obj.closed:
            obj.destroy(linger=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with a trained byte-level BPE tokenizer and a ChatML template (tied embeddings)."""
    from core.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def loop():
    """An event loop per test module, for driving a Generator (an async actor class) in-process."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
