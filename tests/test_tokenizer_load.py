"""A tokenizer loaded by its class name (core.tokenizer_load): the same tokenizer as AutoTokenizer's, loaded in a
fresh process without importing torch, and what env pools are sent: a class name, not a tokenizer (whose pickle
Ray keeps in its object store when it is large, and then logs an error for every restartable actor)."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from actors.random_policy import RandomPolicy
from configs.load import load_config
from core.tokenizer_load import class_path, load

CHAT = [{"role": "user", "content": "You see a red ball. Available actions: turn left, go to red ball 1"}]


def test_loading_by_class_gives_autotokenizers_ids_without_torch(tiny_model_dir, tiny_tokenizer):
    path = class_path(tiny_tokenizer)
    code = ("import json, sys\nfrom core.tokenizer_load import load\n"
            "tok = load(sys.argv[1], sys.argv[2])\n"
            "ids = tok.apply_chat_template(json.loads(sys.argv[3]), add_generation_prompt=True)\n"
            "ids = ids['input_ids'] if hasattr(ids, 'keys') else ids\n"
            "print(json.dumps({'ids': list(ids), 'torch': 'torch' in sys.modules, 'cls': type(tok).__name__}))")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir), path, json.dumps(CHAT)],
                         capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    want = tiny_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert got["ids"] == list(want) and len(want) > 10
    assert got["cls"] == type(tiny_tokenizer).__name__
    assert got["torch"] is False  # AutoTokenizer imports it: the seconds a pool's start saves


@pytest.mark.parametrize("bad", ["no_colon", "json:NoSuchTokenizer", "no_such_module_xyz:Tok", "json:dumps"])
def test_a_class_name_that_names_no_tokenizer_is_refused_naming_it(tiny_model_dir, bad):
    with pytest.raises(ValueError, match="tokenizer class"):
        load(str(tiny_model_dir), bad)


def test_the_random_policy_travels_with_its_tokenizers_class_not_the_tokenizer(tiny_model_dir, tiny_tokenizer):
    cfg = load_config(None, [])
    policy = RandomPolicy(str(tiny_model_dir), cfg.env, seed=3)
    blob = pickle.dumps(policy)
    assert len(blob) < 100_000  # Ray passes arguments under 100 KB inline, not through its object store
    copy = pickle.loads(blob)
    assert copy._tok is None and copy._tok_class == class_path(tiny_tokenizer)
    assert type(copy.tok) is type(tiny_tokenizer)
    assert copy.tok.encode("go to red ball 1") == tiny_tokenizer.encode("go to red ball 1")
    assert len(pickle.dumps(copy)) < 100_000  # and again, once it has loaded its tokenizer
