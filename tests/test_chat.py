"""Append-only chat formatting, with the tiny model's ChatML template and SmolLM2's real one.

The central check: the ids of a multi-turn trajectory decode to exactly what a fresh rendering of the chat
template gives for the same conversation. Differences the templates force, and how they are met:
- The end of a reply: a reply that ended with the sampled end-of-turn token (`<|im_end|>`) is followed by the
  rest of the template's closing only ("\\n"); a reply cut at the token limit gets the whole closing. Both
  decode to the template's `content<|im_end|>\\n`.
- SmolLM2's template inserts its own system prompt when the conversation has none (the `user` instruction
  layout): the start is rendered by the same template, so it is there in both.
- The episode's last observation is not in the record when no reply follows it (done or horizon), so the
  rendering compared against has no trailing user turn and no generation prompt.
- Scripted replies below are canonical tokenizations, so even the ids equal a fresh tokenization of the
  rendering here; replies a model samples need not be (tests/test_generator.py compares those as text).
"""
from __future__ import annotations

import asyncio

import pytest

from core.chat import ChatFormat
from core.env import Env, Observation, StepResult
from core.models import resolve_model
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.scripted_policy import ScriptedPolicy

INSTRUCTION = "You are an agent in a grid world. Answer with Thought: ... then Action: <one available action>."
FIRST = "Your goal: go to the red ball.\nIn front of you in this room, you can see several objects: a red ball 1 " \
        "2 steps in front of you. Available actions: [\"turn left\", \"turn right\", \"go to red ball 1\"]"
REPLIES = ["Thought: the ball is ahead.\nAction: go to red ball 1",
           "Thought: turn first. Action: turn left",
           "I am not sure what to do here, so I will keep thinking about the grid world for a long while. " * 4]


class _GridEnv(Env):
    """Three observations, then done on the third step (its text is never appended: no reply follows it)."""

    family = "grid"

    def __init__(self):
        self.turn = 0

    async def reset(self, item_id: str) -> Observation:
        self.turn = 0
        return Observation(text=FIRST, instruction=INSTRUCTION)

    async def step(self, text: str) -> StepResult:
        self.turn += 1
        done = self.turn == 3
        return StepResult(observation=f"Step {self.turn}: you see a wall.\nAvailable actions: [\"turn left\"]",
                          reward=1.0 if done else 0.0, done=done, valid_action="Action:" in text,
                          parse_rule="strict", success=done)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("default"))


@pytest.fixture(params=["tiny", "smollm2"])
def tokenizer(request, tiny_tokenizer):
    return tiny_tokenizer if request.param == "tiny" else request.getfixturevalue("smollm2_tokenizer")


def _conversation(instruction_role: str, replies: list[str]) -> list[dict]:
    if instruction_role == "system":
        messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": FIRST}]
    else:
        messages = [{"role": "user", "content": INSTRUCTION}, {"role": "assistant", "content": "OK."},
                    {"role": "user", "content": FIRST}]
    for k, reply in enumerate(replies):
        messages.append({"role": "assistant", "content": reply})
        if k < len(replies) - 1:
            messages.append({"role": "user",
                             "content": f"Step {k + 1}: you see a wall.\nAvailable actions: [\"turn left\"]"})
    return messages


@pytest.mark.parametrize("instruction_role", ["system", "user"])
def test_multi_turn_ids_decode_to_a_fresh_template_rendering(tokenizer, instruction_role):
    chat = ChatFormat(tokenizer)
    replies = iter(REPLIES)
    policy = ScriptedPolicy(tokenizer, lambda conversation: next(replies))
    # The third reply is longer than the turn limit: it is cut, and gets the whole closing.
    limit = 1 + max(len(tokenizer.encode(r, add_special_tokens=False)) for r in REPLIES[:2])
    limits = EpisodeLimits(max_tokens_per_turn=limit, instruction_role=instruction_role)
    assert len(tokenizer.encode(REPLIES[2], add_special_tokens=False)) > limit
    traj = asyncio.run(run_episode(_GridEnv(), policy, chat, EpisodeSpec("t-0", "grid_0", "g", 0, horizon=5),
                                   limits))
    traj.validate()
    assert traj.termination.value == "done" and traj.num_turns == 3
    ids = traj.tokens.tolist()
    third = ids[traj.turn_ends[1]:traj.turn_ends[2]]
    sampled_third = [t for t, m in zip(third, traj.loss_mask[traj.turn_ends[1]:traj.turn_ends[2]]) if m]
    assert len(sampled_third) == limit and chat.eos_id not in sampled_third
    cut_text = tokenizer.decode(sampled_third)
    messages = _conversation(instruction_role, REPLIES[:2] + [cut_text])
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(ids) == rendered
    assert ids == list(tokenizer.encode(rendered, add_special_tokens=False))
    # Every sampled token is a reply token; the first two replies end with the sampled end-of-turn token.
    for k in range(2):
        end = int(traj.turn_ends[k])
        assert ids[end - 1] == chat.eos_id and traj.loss_mask[end - 1] == 1
        assert traj.loss_mask[end] == 0  # the rest of the closing ("\n") is template, not sampled


def test_closings_and_user_turn_pieces(tokenizer):
    chat = ChatFormat(tokenizer)
    decode = lambda ids: tokenizer.decode(ids)  # noqa: E731
    assert decode(chat.closing(sampled_eos=False)) == "<|im_end|>\n"
    assert decode(chat.closing(sampled_eos=True)) == "\n"
    assert decode(chat.user_turn("look")) == "<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\n"
    start = decode(chat.start("", "hello"))
    assert start.endswith("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Shows only the last two messages: adding a turn changes what came before, so appending cannot work.
    tok.chat_template = ("{% for m in messages[-2:] %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ValueError, match="re-renders earlier turns"):
        ChatFormat(tok)


def test_pieces_are_the_ids_the_tokenizer_itself_gives(tokenizer):
    """ChatFormat tokenizes through the fast tokenizer's backend: the ids must be transformers' own."""
    chat = ChatFormat(tokenizer)
    assert chat._backend is not None
    texts = ["", " ", "go to red ball 1", "  leading and trailing  ", "Ünïcödé ✓ 日本語 \t\n\n", "<|im_end|> inside",
             "<|im_start|>user\nAvailable actions: turn left, pickup grey key 1<|im_end|>\n", "x" * 3000,
             "1234567890 " * 50, "\x00\x01 control"]
    for text in texts:
        assert chat.encode(text) == list(tokenizer.encode(text, add_special_tokens=False)), repr(text[:40])
