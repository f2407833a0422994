"""The README's two commands are the ones that exist: CI runs the test command verbatim."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_quick_start_has_two_commands_both_installing_first():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert all(c.startswith("bash launch/install.sh && ") for c in commands)
    assert commands[0].endswith("-m launch.train") and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quick_start_commands()[1] in ci
