"""The QA items behind `searchqa_<n>`, and the corpus and retriever they are answered from.

A QA folder holds FlashRAG-style `test.jsonl` and/or `train.jsonl`, one {"question", "golden_answers", ...} per
line. Item ids run over the test file first, then the train file (the reference numbers its test items first too):
`searchqa_0` .. `searchqa_<T-1>` are the test split. With `env.searchqa.qa_dir` empty, the folder is the QA set
generated from the offline corpus (qa_gen.py), written once into the cache.

One `SearchData` per process and configuration (`shared_data`), holding the QA items and the shared retriever.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from configs.env import SearchConfig
from core.env import split_item_id
from environments.searchqa import qa_gen
from environments.searchqa.corpus import read_corpus, write_default_corpus
from environments.searchqa.retriever import Retriever, shared_retriever

SPLIT_FILES = ("test.jsonl", "train.jsonl")
FINDABLE_TOPK = 3  # generated items are checked findable with this many hits, whatever env.searchqa.topk is
FINDABLE_POOL = 10  # hits ranked again by `stable_top` before the top FINDABLE_TOPK are taken


@dataclass(frozen=True)
class QARecord:
    question: str
    golden_answers: tuple[str, ...]
    hops: int = 0  # 0 when unknown (a user's QA set)
    gold_titles: tuple[str, ...] = ()


def cache_root(cfg: SearchConfig) -> Path:
    return Path(cfg.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "agentgym-rl", "searchqa"))


def default_corpus_dir(cfg: SearchConfig) -> Path:
    return write_default_corpus(cache_root(cfg) / "corpus")


def read_qa_dir(folder: Path) -> tuple[list[QARecord], dict[str, int]]:
    records: list[QARecord] = []
    sizes: dict[str, int] = {}
    for name in SPLIT_FILES:
        path = folder / name
        sizes[name.split(".")[0]] = 0
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    answers = row["golden_answers"]
                    answers = (answers,) if isinstance(answers, str) else tuple(str(a) for a in answers)
                    meta = row.get("metadata") or {}
                    records.append(QARecord(str(row["question"]), answers, int(meta.get("hops", 0)),
                                            tuple(meta.get("gold_titles", ()))))
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{lineno}: expected {{\"question\", \"golden_answers\"}}: {e}") from e
                sizes[name.split(".")[0]] += 1
    if not records:
        raise FileNotFoundError(f"QA folder {folder} holds neither test.jsonl nor train.jsonl with items")
    return records, sizes


def stable_top(hits: list, k: int) -> list:
    """The first `k` of `hits` by score rounded to 1e-3, ties by title. BM25 sums float32 terms in an order that
    depends on the CPU's vector units, so passages that tie exactly come out a few ulps apart, and differently on
    different machines (an AVX2 EPYC generated 8,345 items where others generated 8,347); rounded, they tie, and
    the title decides, so the generated set, and with it every `searchqa_<n>`, is the same on every node."""
    return sorted(hits, key=lambda h: (-round(h.score, 3), h.title))[:k]


def write_generated_qa(folder: Path, corpus_retriever: Retriever, corpus_dir: Path) -> Path:
    """Generate the offline QA set into `folder` once (a `complete` marker is written last)."""
    if (folder / "complete").exists():
        return folder
    passages = read_corpus(corpus_dir)

    def findable(titles: list[str]) -> list[set[str]]:
        return [{h.title for h in stable_top(hits, FINDABLE_TOPK)}
                for hits in corpus_retriever.search(titles, FINDABLE_POOL)]

    items = qa_gen.generate(passages, findable)
    folder.mkdir(parents=True, exist_ok=True)
    for name, chunk in (("test", items[:qa_gen.TEST_SIZE]), ("train", items[qa_gen.TEST_SIZE:])):
        tmp = folder / f"{name}.jsonl.tmp-{os.getpid()}-{threading.get_native_id()}"
        with tmp.open("w", encoding="utf-8") as f:
            for item in chunk:
                row = {"question": item.question, "golden_answers": list(item.answers),
                       "metadata": {"hops": item.hops, "gold_titles": list(item.gold_titles), **item.metadata}}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.rename(folder / f"{name}.jsonl")
    # Several processes may generate at once: each writes its own temporary files, and since generation is
    # deterministic, whichever rename lands last leaves the same bytes.
    (folder / "complete").write_text(str(len(items)))
    return folder


class SearchData:
    """The QA records and the retriever for one SearchConfig."""

    def __init__(self, cfg: SearchConfig):
        root = cache_root(cfg)
        corpus_dir = Path(cfg.corpus_dir) if cfg.corpus_dir else None
        if cfg.retriever == "bm25":
            corpus_dir = corpus_dir or default_corpus_dir(cfg)
        self.retriever = shared_retriever(cfg.retriever, corpus_dir, root / "index", cfg.retriever_url, cfg.timeout_s)
        if cfg.qa_dir:
            qa_dir = Path(cfg.qa_dir)
        else:
            # The generated set is defined over the offline corpus, whatever retriever the episodes use.
            offline_dir = default_corpus_dir(cfg)
            offline = shared_retriever("bm25", offline_dir, root / "index", "", cfg.timeout_s)
            qa_dir = write_generated_qa(root / "qa", offline, offline_dir)
        self.records, self.split_sizes = read_qa_dir(qa_dir)

    def record(self, item_id: str) -> QARecord:
        family, n = split_item_id(item_id)
        if family != "searchqa":
            raise ValueError(f"item id {item_id!r} is not a searchqa item")
        if not 0 <= n < len(self.records):
            raise ValueError(f"item id {item_id!r} is out of range: this QA set has ids 0..{len(self.records) - 1}")
        return self.records[n]


_SHARED: dict[tuple, SearchData] = {}
_LOCK = threading.Lock()


def shared_data(cfg: SearchConfig) -> SearchData:
    key = (cfg.retriever, cfg.corpus_dir, cfg.qa_dir, cfg.retriever_url, str(cache_root(cfg)))
    with _LOCK:
        if key not in _SHARED:
            _SHARED[key] = SearchData(cfg)
        return _SHARED[key]
