"""The Search-R1 turn protocol and its answer metric.

A turn acts on the first `<search> query </search>` or `<answer> text </answer>` in it (whichever starts first).
`strict` needs a closed tag pair in lower case (the reference's rule); `lenient` also accepts any letter case and
a last tag left unclosed at the end of the reply (small models often stop before the closing tag).

Metric: exact match after SQuAD normalisation (lower-case; drop punctuation; drop the articles a, an, the;
collapse whitespace) against any of the gold answers: 1 or 0.
"""
from __future__ import annotations

import re
import string

_STRICT = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_LENIENT = re.compile(r"<\s*(search|answer)\s*>(.*?)(?:<\s*/\s*\1\s*>|$)", re.DOTALL | re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def parse_turn(text: str, mode: str) -> tuple[str | None, str, str]:
    """(kind, content, rule): kind is "search", "answer" or None; rule "strict", "lenient" or "none"."""
    m = _STRICT.search(text)
    if mode == "strict":
        return (m.group(1), m.group(2).strip(), "strict") if m else (None, "", "none")
    lenient = _LENIENT.search(text)
    if m and (lenient is None or m.start() <= lenient.start()):
        return m.group(1), m.group(2).strip(), "strict"
    if lenient and lenient.group(2).strip():
        return lenient.group(1).lower(), lenient.group(2).strip(), "lenient"
    return None, "", "none"


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golden_answers: list[str] | tuple[str, ...]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in golden_answers))
