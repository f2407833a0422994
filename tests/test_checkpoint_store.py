"""Checkpoint folders: marker written last, atomic rename, pruning, resolving `resume`."""
from __future__ import annotations

import pytest

from core.checkpoint import MARKER, CheckpointStore, write_json


def save(store: CheckpointStore, step: int) -> None:
    tmp = store.begin(step)
    write_json(tmp / "coordinator.json", {"step": step})
    store.commit(tmp, step)


def test_commit_renames_and_keeps_the_last_n(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (5, 10, 15):
        save(store, step)
    assert [p.name for p in store.complete()] == ["step_00000010", "step_00000015"]
    assert (store.latest_complete() / MARKER).is_file()


def test_a_crashed_save_is_invisible_and_cleaned_up(tmp_path):
    store = CheckpointStore(tmp_path)
    save(store, 5)
    crashed = store.begin(10)
    (crashed / "coordinator.json").write_text("{")  # half-written, no marker
    assert store.latest_complete().name == "step_00000005"
    fake = tmp_path / "step_00000020"  # a folder of the right name without its marker
    fake.mkdir()
    assert store.latest_complete().name == "step_00000005"
    save(store, 10)
    assert not crashed.exists()
    assert store.latest_complete().name == "step_00000010"


def test_resolve(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.resolve("") is None and store.resolve("auto") is None
    save(store, 3)
    assert store.resolve("auto").name == "step_00000003"
    assert store.resolve(str(tmp_path / "step_00000003")).name == "step_00000003"
    with pytest.raises(FileNotFoundError, match="checkpoint.resume"):
        store.resolve(str(tmp_path / "nowhere"))
