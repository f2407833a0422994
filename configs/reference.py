"""The configuration reference, generated from the schema: `python -m configs.reference` writes
docs/configuration.md (`--check` exits 1 when the file is out of date instead).

Every key's documentation is the docstring right below its field in configs/*.py, and every section's is the
docstring of its field in the parent section; tests/test_config_reference.py fails when a key or a section has
none, or when the written file differs from what this module renders.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

from configs.schema import RootConfig

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

HEADER = """# Configuration reference

Generated from the schema's docstrings (`configs/*.py`) by `python -m configs.reference`; do not edit by hand.
Every key below can be set in a YAML recipe (`--config configs/default.yaml`) or as a dotted override on the
command line (`python -m launch.train env.num_actors=4 env.mix={textcraft: 1}`). Values replace what was
there, dicts included; `env.mix.textcraft=0.5` sets one entry of a dict. A config is validated once, at load:
an unknown key, a wrong type or a value outside the constraint column exits with code 2 naming the key.
`python -m launch.train --print-config` prints the resolved config, `--explain` this list in short.
"""


@functools.cache
def field_docs(section: type) -> dict[str, str]:
    """Field name -> the docstring written right below it in the class body (whitespace collapsed)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(section))).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


@dataclasses.dataclass(frozen=True)
class Key:
    key: str  # dotted path
    type: str
    default: str
    constraint: str
    doc: str


@dataclasses.dataclass(frozen=True)
class Section:
    path: str  # dotted path of the section ("" for the root)
    doc: str
    keys: tuple[Key, ...]


def type_name(hint: Any) -> str:
    if hint is Any:
        return "any"
    if typing.get_origin(hint) is None:
        return getattr(hint, "__name__", str(hint))
    args = ", ".join(type_name(a) for a in typing.get_args(hint))
    return f"{typing.get_origin(hint).__name__}[{args}]"


def yaml_value(value: Any) -> str:
    """A value as one writes it in a recipe or an override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def constraint(meta: typing.Mapping[str, Any]) -> str:
    parts = []
    if "choices" in meta:
        parts.append("one of " + ", ".join(yaml_value(c) for c in meta["choices"]))
    parts += [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<=")) if k in meta]
    if meta.get("nonempty"):
        parts.append("non-empty")
    return "; ".join(parts)


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def sections(section: type = RootConfig, path: str = "", doc: str = "") -> list[Section]:
    """Every section of the tree, depth first, each with its own (non-section) keys in declaration order."""
    hints = typing.get_type_hints(section)
    docs = field_docs(section)
    keys, nested = [], []
    for f in dataclasses.fields(section):
        key = f"{path}.{f.name}" if path else f.name
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            nested += sections(hint, key, docs.get(f.name, ""))
        else:
            keys.append(Key(key, type_name(hint), yaml_value(default_of(f)), constraint(f.metadata),
                            docs.get(f.name, "")))
    return [Section(path, doc, tuple(keys)), *nested]


def undocumented() -> list[str]:
    """Keys and sections with no docstring (each must have one)."""
    missing = [f"{s.path} (section)" for s in sections() if s.path and not s.doc]
    return missing + [k.key for s in sections() for k in s.keys if not k.doc]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    lines = [HEADER]
    for s in sections():
        if not s.path:
            continue
        level = "#" * (2 + s.path.count("."))
        lines += [f"{level} `{s.path}`", "", s.doc or "(undocumented)", ""]
        if s.keys:
            lines += ["| key | type | default | constraint | meaning |", "|---|---|---|---|---|"]
            lines += [f"| `{k.key}` | {_cell(k.type)} | `{_cell(k.default)}` | {_cell(k.constraint)} | "
                      f"{_cell(k.doc) or '(undocumented)'} |" for k in s.keys]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="configs.reference", description="write docs/configuration.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.is_file() else ""
        if current != text:
            print(f"{OUTPUT} is out of date: run python -m configs.reference", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    missing = undocumented()
    if missing:
        print(f"undocumented: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
