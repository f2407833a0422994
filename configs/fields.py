"""Field helpers for the typed config: a default plus the constraint it must satisfy.

    num_actors: int = spec(2, ge=1)
    \"\"\"How many EnvPool actors to start.\"\"\"

The constraint lives in the field's metadata and is checked once, at load time, by `configs.load`; a
violation names the dotted key and what was expected. Every field carries a docstring right below it
(tests/test_config.py checks this), which `--explain` prints.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A config value is unknown, mistyped or invalid. `key` is the dotted path."""

    def __init__(self, key: str, expected: str):
        super().__init__(f"{key}: {expected}")
        self.key = key
        self.expected = expected


def spec(default: Any = dataclasses.MISSING, *, ge: float | None = None, gt: float | None = None,
         le: float | None = None, choices: tuple | None = None, nonempty: bool = False) -> Any:
    """A dataclass field with a default and a constraint (mutable defaults are copied per instance)."""
    given = dict(ge=ge, gt=gt, le=le, choices=choices, nonempty=nonempty)
    meta = {k: v for k, v in given.items() if v is not None and v is not False}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_field(key: str, value: Any, meta: dict) -> None:
    """Raise ConfigError if `value` breaks the constraint in `meta`."""
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(key, f"expected one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    numbers = value if isinstance(value, (list, tuple)) else [value]
    for v in numbers:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if "ge" in meta and v < meta["ge"]:
            raise ConfigError(key, f"expected a value >= {meta['ge']}, got {value!r}")
        if "gt" in meta and v <= meta["gt"]:
            raise ConfigError(key, f"expected a value > {meta['gt']}, got {value!r}")
        if "le" in meta and v > meta["le"]:
            raise ConfigError(key, f"expected a value <= {meta['le']}, got {value!r}")
    if meta.get("nonempty") and not value:
        raise ConfigError(key, "expected a non-empty value")
