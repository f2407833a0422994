"""Shared fixtures. Network rule: tests talk only to 127.0.0.1 (or namespaces they create themselves)."""
from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# RAY_AUTH_MODE is left to launch.job.ray_cluster, as in a run: a local Ray checks a token held in the environment.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


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
