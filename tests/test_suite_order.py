"""tests/conftest.py's scheduling order names real modules: each in LONGEST_FIRST exists and holds a slow test
(a renamed or split module would otherwise silently fall back to the unlisted order)."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST


def test_every_module_in_the_longest_first_order_exists_and_is_slow():
    here = Path(__file__).parent
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for name in LONGEST_FIRST:
        path = here / f"{name}.py"
        assert path.is_file(), name
        assert "pytest.mark.slow" in path.read_text(), name
