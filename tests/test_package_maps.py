"""Every package of core, actors, environments, configs and launch carries a map of itself in its docstring.

A package's `__init__` docstring holds a table (`| module | what it is |`) with a row `| `<name>` | ... |` for
each of its modules (every .py file but `__init__` and `__main__`) and each of its subpackages, so a reader
opening a folder learns what each file is before opening it, and a module added without a row fails here. A row
may name several entries in its first cell (`| `a`, `b` | ... |`), and a subpackage may be written `name/`.
The docstrings are read with `ast`: nothing is imported.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("core", "actors", "environments", "configs", "launch")


def packages_under(top: Path) -> list[Path]:
    """`top` and every folder below it that holds an `__init__.py` (caches skipped)."""
    return sorted(p.parent for p in top.rglob("__init__.py") if "__pycache__" not in p.parts)


def map_entries(package: Path) -> list[str]:
    """The names the package's map must have a row for: its modules and its subpackages."""
    modules = [p.stem for p in package.glob("*.py") if p.stem not in {"__init__", "__main__"}]
    subpackages = [p.name for p in package.iterdir()
                   if p.is_dir() and p.name != "__pycache__" and (p / "__init__.py").is_file()]
    return sorted(modules + subpackages)


def mapped_names(doc: str) -> set[str]:
    """The names in the first cell of the docstring's table rows: `| `a`, `b/` | ... |` maps a and b."""
    names = set()
    for line in doc.splitlines():
        cells = line.strip().split("|")
        if len(cells) >= 4 and cells[0] == "":
            names |= {name.removesuffix("/") for name in re.findall(r"`([^`]+)`", cells[1])}
    return names


def unmapped(package: Path) -> list[str]:
    """The entries of `package` that its `__init__` docstring has no table row for."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = mapped_names(doc)
    return [name for name in map_entries(package) if name not in names]


def missing_rows(root: Path = ROOT, tops: tuple[str, ...] = MAPPED) -> list[str]:
    problems = []
    for top in tops:
        for package in packages_under(root / top):
            rel = package.relative_to(root).as_posix()
            problems += [f"{rel}/__init__.py: no row | `{name}` | in its map" for name in unmapped(package)]
    return problems


def test_every_package_maps_every_module_and_subpackage():
    packages = [p for top in MAPPED for p in packages_under(ROOT / top)]
    assert len(packages) >= 20, "the packages were not found"
    assert missing_rows() == []


def mapped(prose: str, *rows: str) -> str:
    """An `__init__` whose docstring is `prose` and a map with `rows` (each `| first cell | text |`)."""
    return f'"""{prose}\n\n| module | what it is |\n|---|---|\n' + "".join(f"{r}\n" for r in rows) + '"""\nX = 1\n'


def test_checker_catches_a_missing_row(tmp_path):
    core = tmp_path / "core"
    pkg = core / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (core / "__init__.py").write_text(mapped("Top.", "| `pkg/` | a subpackage, written with its slash |"))
    (pkg / "__init__.py").write_text(mapped("`forgotten` and `sub`, named in prose only, do not count.",
                                            "| `a`, `d` | two modules in one row |"))
    (pkg / "sub" / "__init__.py").write_text(mapped("A subpackage.", "| `b` | b |"))
    for name in ("a.py", "d.py", "forgotten.py", "__main__.py", "sub/b.py", "sub/c.py", "__pycache__/__init__.py"):
        (pkg / name).write_text("")
    assert missing_rows(tmp_path, ("core",)) == [
        "core/pkg/__init__.py: no row | `forgotten` | in its map",
        "core/pkg/__init__.py: no row | `sub` | in its map",
        "core/pkg/sub/__init__.py: no row | `c` | in its map",
    ]
