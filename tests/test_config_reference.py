"""docs/configuration.md is generated from the schema: it must be current, and every key must be documented."""
from __future__ import annotations

import dataclasses

from configs import reference
from configs.load import explain


def test_configuration_md_is_up_to_date():
    written = reference.OUTPUT.read_text() if reference.OUTPUT.is_file() else ""
    assert written == reference.render(), "docs/configuration.md is out of date: run python -m configs.reference"


def test_every_key_and_section_is_documented():
    assert reference.undocumented() == []


def test_the_reference_lists_every_key_of_the_schema_once():
    text = reference.render()
    keys = [key for key, _, _ in explain()]
    assert len(keys) > 80
    assert all(text.count(f"| `{key}` |") == 1 for key in keys)


def test_an_undocumented_key_is_caught(monkeypatch):
    """A field added without a docstring shows up in `undocumented()` and in the rendered page."""
    @dataclasses.dataclass
    class Bare:
        documented: int = 1
        """Has one."""
        bare: int = 2

    real = reference.sections

    def with_bare(section=reference.RootConfig, path="", doc=""):
        found = real(section, path, doc)
        return found + real(Bare, "model.extra", "A section.") if section is reference.RootConfig else found

    monkeypatch.setattr(reference, "sections", with_bare)
    assert reference.undocumented() == ["model.extra.bare"]
    assert "| `model.extra.bare` | int | `2` |  | (undocumented) |" in reference.render()
    assert "| `model.extra.documented` | int | `1` |  | Has one. |" in reference.render()


def test_values_read_as_they_are_written_in_a_recipe():
    assert [reference.yaml_value(v) for v in (True, "", "auto", [1, 2], {"babyai": 1.0}, 0.5)] == \
        ["true", '""', "auto", "[1, 2]", "{babyai: 1.0}", "0.5"]
    assert reference.constraint({"ge": 1, "le": 8}) == ">= 1; <= 8"
    assert reference.constraint({"choices": ("off", "on")}) == "one of off, on"
