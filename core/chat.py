"""Token-level chat formatting for multi-turn episodes: render the start once, then only append.

The model's chat template is applied to the conversation start once. Every later piece (the end of an
assistant reply, a user turn with an env observation, the next generation prompt) is the *difference* between
two renderings of a small probe conversation, tokenized on its own and appended. Earlier turns are never
re-tokenized, so the learner trains on exactly the ids the generator saw and sampled.

Because pieces are tokenized separately, the ids can differ from tokenizing the whole rendered text at once
(BPE merges do not cross piece boundaries); the decoded text is the same. tests/test_chat.py checks both.
"""
from __future__ import annotations

from typing import Any

_PROBE_USER = "\x00probe-user\x00"
_PROBE_REPLY = "\x00probe-reply\x00"


class ChatFormat:
    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        # A fast tokenizer's Rust backend, called directly: the same ids as `tokenizer.encode` (tests/test_chat.py)
        # at a fifth of the cost (46 against 244 us a turn in an env pool: transformers goes through encode_batch).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.eos_id: int = tokenizer.eos_token_id
        eos_text = tokenizer.convert_ids_to_tokens(self.eos_id)
        base = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
        rendered = self._render(base, False)
        # What the template writes after an assistant reply's content, e.g. "<|im_end|>\n".
        close = rendered[rendered.rindex(_PROBE_REPLY) + len(_PROBE_REPLY):]
        # If the model sampled the end-of-turn token itself, only the rest of the closing is still owed.
        self.after_eos_ids = self.encode(close[len(eos_text):] if close.startswith(eos_text) else close)
        self.close_ids = self.encode(close)
        extended = self._render(base + [{"role": "user", "content": _PROBE_USER}], True)
        if not extended.startswith(rendered):
            raise ValueError("the chat template re-renders earlier turns when a turn is added; "
                             "append-only tokenization needs a template that only appends")
        delta = extended[len(rendered):]
        self._user_prefix, self._user_suffix = delta.split(_PROBE_USER)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tok.encode(text, add_special_tokens=False))

    def start(self, instruction: str, observation: str, instruction_role: str = "system") -> list[int]:
        """Ids of the conversation start, ending with the generation prompt for the first reply."""
        if instruction_role == "system" and instruction:
            messages = [{"role": "system", "content": instruction}, {"role": "user", "content": observation}]
        elif instruction:  # AgentGym's layout: the instruction as a user turn the assistant answers "OK."
            messages = [{"role": "user", "content": instruction}, {"role": "assistant", "content": "OK."},
                        {"role": "user", "content": observation}]
        else:
            messages = [{"role": "user", "content": observation}]
        return self.encode(self._render(messages, True))

    def closing(self, sampled_eos: bool) -> list[int]:
        """Ids that end an assistant reply: the rest after a sampled end-of-turn token, or the whole closing."""
        return list(self.after_eos_ids if sampled_eos else self.close_ids)

    def user_turn(self, text: str) -> list[int]:
        """Ids of a user turn holding `text`, followed by the next generation prompt."""
        return self.encode(self._user_prefix + text + self._user_suffix)

    def user_content(self, decoded: str) -> str:
        """The content of the last user turn in `decoded` (text decoded with its special tokens: a closing, a
        user turn and the generation prompt), without the template's markup; `decoded` stripped when the
        template's pieces are not in it. For transcripts people read (core/transcript.py)."""
        at = decoded.rfind(self._user_prefix) if self._user_prefix else -1
        if at < 0:
            return decoded.strip()
        body = decoded[at + len(self._user_prefix):]
        return body[: -len(self._user_suffix)] if self._user_suffix and body.endswith(self._user_suffix) else body
