"""Printing for benchmarks: an aligned table, then the figures as one JSON line (always the last line)."""
from __future__ import annotations

import json
import math
from typing import Any, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or math.isnan(value):
            return f"{value:.3g}"
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def emit(figures: dict[str, Any]) -> None:
    """The final line of every benchmark: its figures as JSON, rounded to 4 significant digits."""
    rounded = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps(rounded, sort_keys=True), flush=True)
