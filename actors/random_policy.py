"""The random baseline as a `Policy`: each turn it names one of the actions the env lists, chosen uniformly.

It runs through the same env pools and rollout loop as the model, so its figures are measured exactly like the
model's. What must hold:
- The actions come from the family's `available_actions(conversation_text) -> list[str]` hook (environments
  registry extras), applied to the decoded conversation so far (the latest observation last). A family without
  the hook cannot have a random baseline: `random_refusal` names it, before anything starts.
- The choice is seeded by the episode's item id, sample index and turn (the prompt's length): the same items
  give the same episodes in any process, in any order, on any number of pools.
- The reply is `Action:\n<action>`, which every family's parser accepts in both modes; its tokens are marked
  as sampled by version 0 with logprob 0 (nothing here is ever trained). A reply longer than the turn's token
  limit is cut as a sampler's would be (the env then rejects it: raise rollout.max_tokens_per_turn).
- It is picklable: it travels with its tokenizer's class name and loads the tokenizer by it on first use, in the
  process that runs the episodes (core.tokenizer_load: no torch import there, no large Ray argument).
"""
from __future__ import annotations

import random
from typing import Any

from core.policy import GenerationRequest, GenerationResult
from core.tokenizer_load import class_path, load as load_tokenizer
from environments.item_sampler import family_of
from environments.registry import get_family

HOOK = "available_actions"


def random_refusal(families: list[str]) -> str:
    """Why `--policy random` cannot evaluate these families (empty: it can)."""
    missing = [f for f in families if HOOK not in get_family(f).extras]
    if not missing:
        return ""
    return (f"the random policy needs the actions an env lists, and {', '.join(missing)} "
            f"list{'s' if len(missing) == 1 else ''} none in {'its' if len(missing) == 1 else 'their'} "
            "observations")


def reply_text(action: str) -> str:
    return f"Action:\n{action}"


class RandomPolicy:
    def __init__(self, tokenizer_dir: str, env_cfg: Any, seed: int = 0):
        """`env_cfg`: the `env` config section (resolves an item's family); `seed` varies every choice."""
        self.tokenizer_dir, self.env_cfg, self.seed = tokenizer_dir, env_cfg, seed
        self._tok = None
        self._tok_class = ""  # set when unpickled: the class the sender loaded
        self.calls = 0

    def __getstate__(self) -> dict:
        # the tokenizer's class travels, named: the env pool loads it by that class, where AutoTokenizer would
        # import torch there (about 4 CPU-seconds of the pool's start); core.tokenizer_load
        return {"tokenizer_dir": self.tokenizer_dir, "env_cfg": self.env_cfg, "seed": self.seed,
                "tok_class": self._tok_class or class_path(self.tok)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokenizer_dir"], state["env_cfg"], state["seed"])
        self._tok_class = state.get("tok_class", "")

    @property
    def tok(self) -> Any:
        if self._tok is None:
            self._tok = load_tokenizer(self.tokenizer_dir, self._tok_class)
        return self._tok

    def choose(self, request: GenerationRequest, conversation: str) -> str:
        """The action for this turn: uniform over the listed ones, seeded by item, sample and turn."""
        family = get_family(family_of(request.item_id, self.env_cfg))
        actions = family.extras[HOOK](conversation)
        if not actions:
            raise RuntimeError(f"{family.name}: the observation of {request.item_id} lists no actions")
        rng = random.Random(f"random-policy/{self.seed}/{request.item_id}/{request.sample_index}/"
                            f"{len(request.prompt_ids)}")
        return rng.choice(actions)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        conversation = self.tok.decode(request.prompt_ids, skip_special_tokens=True)
        reply = list(self.tok.encode(reply_text(self.choose(request, conversation)), add_special_tokens=False))
        if len(reply) + 1 <= request.max_tokens:
            ids, finish = reply + [self.tok.eos_token_id], "stop"
        else:
            ids, finish = reply[: request.max_tokens], "length"
        return GenerationResult(token_ids=ids, logprobs=[0.0] * len(ids), versions=[0] * len(ids),
                                finish_reason=finish)
