"""A QA set generated from the offline Wikipedia passages, deterministically, with exact gold answers.

Two kinds of question, both cloze-style so that the gold answer is a span copied from the passage:
- single-hop: a sentence of article A with one span blanked; the question names A. The answer is the span.
- two-hop (bridge): a sentence of article A in which the title of another article B is blanked, then a
  sentence of B with a span blanked (B's own name written as "[X]"). Only A is named, so the agent must first
  read A to learn B, then search B. The answer is the span from B.

A span is a run of two or more capitalised words (a name) or a year; it must occur once in its passage, so the
blank has one filling. Every item is also checked to be findable: a BM25 search for each gold passage's title
returns that passage in the top 3 of the offline corpus (items failing this are dropped), so a scripted agent
that searches the gold titles and answers the gold answer is always rewarded.

Order and splits: items are drawn in a fixed interleaving of single- and two-hop items (seeded shuffle of each
kind); `searchqa_0` .. `searchqa_<TEST_SIZE-1>` are the test split and the rest the train split, as in the
reference, whose test ids also come first. The set is written as FlashRAG-style `test.jsonl` / `train.jsonl`
({"id", "question", "golden_answers", "metadata"}), the same layout a user's `qa_dir` has.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

from environments.searchqa.corpus import Passage

TEST_SIZE = 350
TWO_HOP_SHARE = 0.3  # fraction of two-hop items in both splits
SEED = 20250
BLANK = "____"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_WORD_CAP = r"[A-Z][\w'\-]*[a-z][\w'\-]*"  # a capitalised word with at least one lower-case letter
_NAME = re.compile(rf"\b{_WORD_CAP}(?:\s+(?:of|de|von|van|the|and|la|du|del)?\s*{_WORD_CAP})+")
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-2][0-9])\b")
_MAX_SENTENCE_CHARS = 320
_WORD_START = re.compile(r"(?:^|(?<=\s))[\"'(]?(\S+)")


@dataclass(frozen=True)
class QAItem:
    question: str
    answers: tuple[str, ...]
    hops: int
    gold_titles: tuple[str, ...]  # the passages to read, in order
    metadata: dict = field(default_factory=dict, compare=False)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _candidates(sentence: str, text: str, avoid: str) -> list[str]:
    """Spans of `sentence` that could be blanked: names first, then years, each once in `text`."""
    spans = [m.group(0) for m in _NAME.finditer(sentence) if m.start() > 0]
    spans += [m.group(0) for m in _YEAR.finditer(sentence)]
    avoid_words = {w.lower() for w in re.findall(r"\w+", avoid)}
    out = []
    for span in spans:
        if len(span) > 60 or text.count(span) != 1:
            continue
        if {w.lower() for w in re.findall(r"\w+", span)} & avoid_words:
            continue  # the answer must not be readable off the question's article name
        out.append(span)
    return out


def single_hop(p: Passage) -> QAItem | None:
    for sentence in sentences(p.text)[:4]:
        if len(sentence) > _MAX_SENTENCE_CHARS:
            continue
        for span in _candidates(sentence, p.text, p.title):
            cloze = sentence.replace(span, BLANK, 1)
            question = f'In the Wikipedia article "{p.title}", what fills the blank? "{cloze}"'
            return QAItem(question, (span,), 1, (p.title,), {"passage_id": p.id})
    return None


def two_hop(a: Passage, b: Passage) -> QAItem | None:
    """A bridge question from A (which mentions B's title once) to a span of B."""
    bridge = next((s for s in sentences(a.text) if b.title in s and len(s) <= _MAX_SENTENCE_CHARS), None)
    if bridge is None or a.text.count(b.title) != 1:
        return None
    for sentence in sentences(b.text)[:4]:
        if len(sentence) > _MAX_SENTENCE_CHARS:
            continue
        for span in _candidates(sentence, b.text, f"{a.title} {b.title}"):
            if span in a.text:
                continue
            masked = sentence.replace(span, BLANK, 1).replace(b.title, "[X]")
            question = (f'In the Wikipedia article "{a.title}", the blank hides the name of another article, '
                        f'call it X: "{bridge.replace(b.title, BLANK, 1)}". In the Wikipedia article on X, what '
                        f'fills the blank? "{masked}"')
            return QAItem(question, (span,), 2, (a.title, b.title), {"passage_ids": [a.id, b.id], "bridge": b.title})
    return None


def _bridge_targets(passages: list[Passage]) -> dict[str, Passage]:
    """Titles usable as bridge entities: multi-word names (or one long capitalised word), one passage each."""
    by_title: dict[str, Passage] = {}
    for p in passages:
        words = p.title.split()
        if p.title[:1].isupper() and (len(words) >= 2 or len(p.title) >= 7) and "(" not in p.title:
            by_title.setdefault(p.title, p)
    return by_title


def _mentions(text: str, by_first_word: dict[str, list[str]]) -> list[str]:
    """Titles occurring in `text` at word boundaries, in order of appearance (longest title first at a spot)."""
    found = []
    for m in _WORD_START.finditer(text):
        token, start = m.group(1), m.start(1)
        for key in dict.fromkeys((token, token.rstrip(",.;:)\"'"))):
            title = next((t for t in by_first_word.get(key, ()) if text.startswith(t, start)
                          and (start + len(t) == len(text) or not text[start + len(t)].isalnum())), None)
            if title is not None:
                found.append(title)
                break
    return found


def generate(passages: list[Passage], findable: Callable[[list[str]], list[set[str]]]) -> list[QAItem]:
    """The QA set in item-id order. `findable(titles)` returns, per title query, the titles in its top 3."""
    singles = [q for q in (single_hop(p) for p in passages) if q is not None]
    targets = _bridge_targets(passages)
    by_first_word: dict[str, list[str]] = {}
    for title in sorted(targets, key=len, reverse=True):
        by_first_word.setdefault(title.split()[0], []).append(title)
    doubles = []
    for a in passages:
        for title in _mentions(a.text, by_first_word):
            if title == a.title or title in a.title:
                continue
            item = two_hop(a, targets[title])
            if item is not None:
                doubles.append(item)
                break  # at most one bridge question per first article
    queries = sorted({t for q in singles + doubles for t in q.gold_titles})
    tops = dict(zip(queries, findable(queries)))
    keep = [q for q in singles + doubles if all(t in tops[t] for t in q.gold_titles)]
    singles = [q for q in keep if q.hops == 1]
    doubles = [q for q in keep if q.hops == 2]
    rng = random.Random(SEED)
    rng.shuffle(singles)
    rng.shuffle(doubles)
    ordered: list[QAItem] = []
    # Interleave so that every prefix (hence the test split) holds about TWO_HOP_SHARE two-hop items.
    i = j = 0
    while i < len(singles) or j < len(doubles):
        want_double = j < len(doubles) and (i >= len(singles) or (j + 1) <= TWO_HOP_SHARE * (i + j + 1))
        if want_double:
            ordered.append(doubles[j])
            j += 1
        else:
            ordered.append(singles[i])
            i += 1
    return ordered
