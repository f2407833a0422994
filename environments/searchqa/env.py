"""The Search env (Search-R1 style deep search): search a corpus, then answer.

Per turn the env acts on the first `<search>` or `<answer>` tag (protocol.py):
- search: the top-k passages, as `<information>Doc 1(Title: T) text ...</information>`; reward 0.
- answer: reward 1 and success when it exactly matches a gold answer after SQuAD normalisation, else 0. A wrong
  answer ends the episode when `env.searchqa.end_on_wrong_answer` is true (the default); otherwise the agent is
  told it was wrong and may search or answer again (the reference's behaviour).
- neither: an explanatory message, nothing changes, valid_action false.
Retrieval failures (a remote server down, a malformed answer) raise: they are env errors, never a zero reward.
"""
from __future__ import annotations

from configs.env import SearchConfig
from core.env import Observation, StepResult, SyncEnv
from environments.searchqa.dataset import QARecord, SearchData, shared_data
from environments.searchqa.protocol import exact_match, parse_turn
from environments.searchqa.retriever import format_hits

INSTRUCTION = """Answer the question. Reason step by step inside <think> and </think>. Whenever you lack \
knowledge, search a Wikipedia corpus by writing <search> your query </search>; the top results come back \
between <information> and </information>. You may search as many times as you need. When you know the answer, \
give it inside <answer> and </answer>, as a short phrase without explanation, for example <answer> Beijing \
</answer>. Each reply should contain exactly one <search> or one <answer>."""

INVALID = ("Your reply had no action. To search, put the query between <search> and </search>. To answer, put "
           "the answer between <answer> and </answer>.")
WRONG_CONTINUE = "Your answer is not correct. You may search again or give another answer."


class SearchEnv(SyncEnv):
    family = "searchqa"

    def __init__(self, cfg: SearchConfig):
        self.cfg = cfg
        self._data: SearchData | None = None  # loaded on the first reset, on the env's worker thread
        self._record: QARecord | None = None
        self._done = True
        self.searches = 0

    @property
    def data(self) -> SearchData:
        if self._data is None:
            self._data = shared_data(self.cfg)
        return self._data

    def reset(self, item_id: str) -> Observation:
        self._record = self.data.record(item_id)
        self._done = False
        self.searches = 0
        return Observation(text=f"Question: {self._record.question}", instruction=INSTRUCTION,
                           info={"hops": self._record.hops})

    def step(self, text: str) -> StepResult:
        if self._done or self._record is None:
            raise RuntimeError("SearchEnv.step called with no episode running; call reset first")
        kind, content, rule = parse_turn(text, self.cfg.parse_mode)
        if kind is None or not content:
            return StepResult(observation=INVALID, reward=0.0, done=False, valid_action=False, parse_rule="none")
        if kind == "search":
            hits = self.data.retriever.search([content], self.cfg.topk)[0]
            self.searches += 1
            body = format_hits(hits) if hits else "No documents matched the query."
            return StepResult(observation=f"\n<information>{body}</information>\n", reward=0.0, done=False,
                              valid_action=True, parse_rule=rule, info={"query": content, "hits": len(hits)})
        correct = exact_match(content, self._record.golden_answers) == 1.0
        self._done = correct or self.cfg.end_on_wrong_answer
        observation = "Your answer is correct." if correct else (
            "Your answer is not correct." if self._done else WRONG_CONTINUE)
        return StepResult(observation=observation, reward=1.0 if correct else 0.0, done=self._done,
                          valid_action=True, parse_rule=rule, success=correct, score=1.0 if correct else 0.0,
                          info={"answer": content, "searches": self.searches})
