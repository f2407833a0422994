"""Retrievers: `search(queries, topk) -> per query, a ranked list of Hits`.

- `BM25Retriever`: a `bm25s` index over a corpus folder (Search-R1/FlashRAG JSONL). The index is built once and
  cached on disk next to a signature of the corpus files; later processes load it (tens of ms) instead of
  rebuilding. Passages with a zero BM25 score (no query word matched) are not returned.
- `RemoteRetriever`: a client of Search-R1's retrieval server, `POST <url>/retrieve {"queries": [...], "topk": k,
  "return_scores": true}` -> `{"result": [[{"document": {"id", "contents": "\\"Title\\"\\ntext"}, "score"}, ...]]}`.
  A transport failure or a malformed answer raises (the env pool turns it into an env error, never a zero reward).

One retriever per process, shared by all the process's envs: `shared_retriever(cfg)` caches it by its settings.
A retriever is safe to call from several env worker threads (a lock serialises BM25 scoring, which is CPU-bound
anyway; HTTP requests run concurrently).
"""
from __future__ import annotations

import abc
import hashlib
import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from environments.searchqa.corpus import Passage, corpus_signature, read_corpus, split_contents

_INDEX_FORMAT = "bm25s-v1"


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float


class Retriever(abc.ABC):
    @abc.abstractmethod
    def search(self, queries: list[str], topk: int) -> list[list[Hit]]: ...

    def close(self) -> None:
        return None


class BM25Retriever(Retriever):
    def __init__(self, corpus_dir: Path, index_root: Path):
        import bm25s

        self._bm25s = bm25s
        self.corpus_dir = Path(corpus_dir)
        self.passages: list[Passage] = read_corpus(self.corpus_dir)
        key = hashlib.sha256(f"{_INDEX_FORMAT}|{self.corpus_dir.resolve()}|{corpus_signature(self.corpus_dir)}"
                             .encode()).hexdigest()[:16]
        self.index_dir = Path(index_root) / f"bm25-{key}"
        self.built_index = False  # true when this process built the index rather than loading it
        if (self.index_dir / "complete").exists():
            self.index = bm25s.BM25.load(str(self.index_dir), show_progress=False)
        else:
            self.index = self._build()
        self._lock = threading.Lock()

    def _build(self):
        bm25s = self._bm25s
        tokens = bm25s.tokenize([p.contents for p in self.passages], stopwords="en", show_progress=True)
        index = bm25s.BM25()
        index.index(tokens, show_progress=True)
        # Written to a temporary folder and renamed, with a completion marker, so a half-written index is
        # never loaded (several processes may race to build it: the first rename wins, the others discard).
        tmp = self.index_dir.with_name(f"{self.index_dir.name}.tmp-{threading.get_native_id()}")
        tmp.mkdir(parents=True, exist_ok=True)
        index.save(str(tmp), show_progress=False)
        (tmp / "complete").write_text(str(len(self.passages)))
        try:
            tmp.rename(self.index_dir)
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        self.built_index = True
        return index

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        tokens = self._bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        k = min(topk, len(self.passages))
        with self._lock:
            docs, scores = self.index.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        out = []
        for row_docs, row_scores in zip(docs, scores):
            hits = []
            for doc, score in zip(row_docs, row_scores):
                if score > 0:
                    p = self.passages[int(doc)]
                    hits.append(Hit(p.id, p.title, p.text, float(score)))
            out.append(hits)
        return out


class RemoteRetriever(Retriever):
    """Client of a Search-R1 retrieval server (the real one serves wiki-18 with an e5 index of about 64 GB)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        if not url:
            raise ValueError("env.searchqa.retriever_url: expected the URL of a Search-R1 /retrieve server")
        self.url = url.rstrip("/")
        if not self.url.endswith("/retrieve"):
            self.url += "/retrieve"
        self.timeout_s = timeout_s

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            payload = json.loads(response.read())
        try:
            rows = payload["result"]
            if len(rows) != len(queries):
                raise ValueError(f"{len(rows)} result lists for {len(queries)} queries")
            out = []
            for row in rows:
                hits = []
                for entry in row:
                    doc = entry["document"] if "document" in entry else entry
                    title, text = split_contents(doc["contents"])
                    hits.append(Hit(str(doc.get("id", "")), title, text, float(entry.get("score", 0.0))))
                out.append(hits)
            return out
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"retrieval server {self.url} answered in an unexpected shape: {e}; "
                             f"got {json.dumps(payload)[:300]}") from e


_SHARED: dict[tuple, Retriever] = {}
_SHARED_LOCK = threading.Lock()


def shared_retriever(kind: str, corpus_dir: Path | None, index_root: Path | None, url: str,
                     timeout_s: float) -> Retriever:
    """The process's retriever for these settings (built on first use, then shared)."""
    key = (kind, str(corpus_dir), str(index_root), url)
    with _SHARED_LOCK:
        if key not in _SHARED:
            if kind == "bm25":
                _SHARED[key] = BM25Retriever(corpus_dir, index_root)
            elif kind == "remote":
                _SHARED[key] = RemoteRetriever(url, timeout_s)
            else:
                raise ValueError(f"env.searchqa.retriever: unknown retriever {kind!r}")
        return _SHARED[key]


def format_hits(hits: list[Hit]) -> str:
    """Search-R1's rendering: `Doc 1(Title: T) text` lines."""
    return "\n".join(f"Doc {i}(Title: {h.title}) {h.text}" for i, h in enumerate(hits, 1))
