"""Load, override and validate the config once, before anything heavy is imported.

    cfg = load_config("configs/default.yaml", ["env.num_actors=4", "algorithm.rounds_ctrl.rounds=[10,20,30]"])

Values in a YAML recipe or an override replace what was there: a dict-valued field such as `env.mix` is
replaced whole rather than merged key by key, so `env.mix={textcraft: 1}` trains on TextCraft alone. Any
problem raises `ConfigError` naming the dotted key and what was expected.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from configs.fields import ConfigError, check_field
from configs.schema import RootConfig

DEFAULT_RECIPE = Path(__file__).with_name("default.yaml")


def _known_keys(node_type: type) -> str:
    return ", ".join(f.name for f in dataclasses.fields(node_type))


def _set(cfg: DictConfig, key: str, value: Any) -> None:
    """Set one dotted key, checking every part of it exists and converting the value to the field's type."""
    parts = key.split(".")
    section_type: type = RootConfig
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(section_type)}
        where = ".".join(parts[:i]) or "the top level"
        if part not in names:
            raise ConfigError(key, f"unknown key {part!r} under {where}; expected one of {_known_keys(section_type)}")
        hint = typing.get_type_hints(section_type)[part]
        if i == len(parts) - 2 and typing.get_origin(hint) is dict:
            break  # `env.mix.textcraft=0.5` sets one entry of a dict-valued field
        if i < len(parts) - 1:
            if not dataclasses.is_dataclass(hint):
                raise ConfigError(key, f"{'.'.join(parts[:i + 1])} is a value, not a section")
            section_type = hint
        elif hint is str and isinstance(value, bool):
            value = _yaml_word(value, names[part].metadata.get("choices", ()))
    try:
        OmegaConf.update(cfg, key, value, merge=False)
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        raise ConfigError(key, f"wrong type or value: {msg}") from None


def _yaml_word(value: bool, choices: tuple) -> Any:
    """YAML reads off/on/yes/no as booleans; for a text field whose choices hold one of those words, that
    word is what was written (`transport.auth=off`)."""
    words = ("off", "no", "false") if value is False else ("on", "yes", "true")
    return next((c for c in choices if c in words), value)


def _apply(cfg: DictConfig, values: dict, prefix: str = "") -> None:
    """Apply a nested mapping, descending only into sections (dataclasses); other values replace."""
    for k, v in values.items():
        key = f"{prefix}{k}"
        node = OmegaConf.select(cfg, key, default=None) if "." not in str(k) else None
        is_section = isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node))
        if is_section and isinstance(v, dict):
            _apply(cfg, v, key + ".")
        else:
            _set(cfg, key, v)


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", parsed c). Values are parsed as YAML (numbers, bools, lists, dicts)."""
    if "=" not in item or item.startswith("="):
        raise ConfigError(item, "expected an override of the form key=value")
    key, raw = item.split("=", 1)
    key = key.lstrip("+")
    try:
        value = OmegaConf.to_container(OmegaConf.create({"v": _yaml_value(raw)}))["v"]
    except Exception as exc:
        raise ConfigError(key, f"could not parse value {raw!r}: {exc}") from None
    return key, value


def _yaml_value(raw: str) -> Any:
    import yaml  # PyYAML comes with omegaconf

    return yaml.safe_load(raw) if raw.strip() else ""


def validate(obj: Any, prefix: str = "") -> None:
    """Check every field's constraint and each section's own `validate()`; raise on the first problem."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            validate(value, key + ".")
        else:
            check_field(key, value, dict(f.metadata))
    hook = getattr(obj, "validate", None)
    if callable(hook):
        for sub, expected in hook():
            raise ConfigError(f"{prefix}{sub}", expected)


def gpu_settings(cfg: RootConfig) -> list[str]:
    """The `key=value` settings that put this run's generator or learner on GPUs (empty: a CPU run)."""
    g, learner = cfg.generator, cfg.learner
    settings = []
    if g.device == "cuda":
        settings.append(f"generator.device={g.device}")
    if g.num_gpus > 0:
        settings.append(f"generator.num_gpus={g.num_gpus:g}")
    if learner.num_gpus_per_rank > 0:
        settings.append(f"learner.num_gpus_per_rank={learner.num_gpus_per_rank:g}")
    return settings


def config_warnings(cfg: RootConfig) -> list[tuple[str, str]]:
    """(dotted key, why) for settings that load and run but are almost surely not meant. Loading never fails
    on them; the entry points log each one at start."""
    warnings = []
    on_gpus = gpu_settings(cfg)
    if on_gpus and cfg.model.dtype == "float32":
        warnings.append(("model.dtype", f"float32 on GPUs ({', '.join(on_gpus)}) takes twice the memory of "
                                        "bfloat16 for weights, KV cache and activations, and runs without bf16 "
                                        "tensor cores; set model.dtype=bfloat16 (float32 is meant for CPU runs)"))
    return warnings


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> RootConfig:
    """Defaults, then the recipe at `path` (the default recipe when None), then the overrides."""
    cfg = OmegaConf.structured(RootConfig)
    recipe = Path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        raise ConfigError("--config", f"expected a YAML file, {str(recipe)!r} does not exist")
    try:
        data = OmegaConf.to_container(OmegaConf.load(recipe), resolve=True)
    except Exception as exc:
        raise ConfigError("--config", f"{recipe} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data and not isinstance(data, dict):
        raise ConfigError("--config", f"{recipe} must hold a mapping at the top level")
    _apply(cfg, data or {})
    for item in overrides:
        _set(cfg, *parse_override(item))
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(getattr(exc, "full_key", "") or "config", str(exc).splitlines()[0]) from None
    validate(obj)
    return obj


def to_yaml(cfg: RootConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict:
    """A plain-dict copy of a config section (for logging and for shipping a section to an actor)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def from_dict(section_type: type, data: dict) -> Any:
    """Rebuild a section from `to_dict` output, validated by the same rules."""
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(section_type), data))
    validate(obj)
    return obj


def explain(section: type = RootConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, docstring) for every field, read from the attribute docstrings in the source."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(section))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[stmt.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[attr-defined]
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(section)
    for f in dataclasses.fields(section):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(explain(hints[f.name], key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            rows.append((key, repr(default), docs.get(f.name, "")))
    return rows
