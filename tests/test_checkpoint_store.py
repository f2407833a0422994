"""Checkpoint folders: marker written last, atomic rename, pruning, resolving `resume`."""
from __future__ import annotations

import json
import logging
import os

import pytest

from core.checkpoint import MARKER, CheckpointStore, verify, write_json


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


def save_with_files(store: CheckpointStore, step: int) -> None:
    tmp = store.begin(step)
    write_json(tmp / "coordinator.json", {"step": step, "state": {"step": step}})
    (tmp / "learner").mkdir()
    (tmp / "learner" / "model.bin").write_bytes(bytes(range(256)) * 64)
    store.commit(tmp, step)


def test_marker_lists_every_file_with_size_and_checksum(tmp_path):
    store = CheckpointStore(tmp_path)
    save_with_files(store, 4)
    marker = json.loads((store.path_of(4) / MARKER).read_text())
    assert set(marker["files"]) == {"coordinator.json", "learner/model.bin"}
    assert marker["files"]["learner/model.bin"][0] == 256 * 64
    assert verify(store.path_of(4)) == ""


@pytest.mark.parametrize("damage", ["cut_json", "flip_tensor_byte", "delete_file"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, caplog):
    store = CheckpointStore(tmp_path, keep_last=3)
    save_with_files(store, 2)
    save_with_files(store, 4)
    newest = store.path_of(4)
    if damage == "cut_json":
        text = (newest / "coordinator.json").read_text()
        (newest / "coordinator.json").write_text(text[: len(text) // 2])
    elif damage == "flip_tensor_byte":
        data = bytearray((newest / "learner" / "model.bin").read_bytes())
        data[100] ^= 0xFF
        (newest / "learner" / "model.bin").write_bytes(bytes(data))
    else:
        (newest / "learner" / "model.bin").unlink()
    assert verify(newest) != ""
    with caplog.at_level(logging.WARNING, logger="agentgym.checkpoint"):
        assert store.resolve("auto") == store.path_of(2)
    assert "falling back" in caplog.text
    with pytest.raises(FileNotFoundError, match="damaged"):
        store.resolve(str(newest))


def test_a_crash_while_resaving_a_step_leaves_a_complete_checkpoint(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, keep_last=1)
    save_with_files(store, 6)
    real_replace = os.replace
    calls = []

    def crash_after_moving_the_old_one_aside(src, dst):
        calls.append((src, dst))
        real_replace(src, dst)
        if len(calls) == 2:  # the old folder is aside; the new one was about to be renamed into place
            raise KeyboardInterrupt("killed")

    tmp = store.begin(6)
    write_json(tmp / "coordinator.json", {"step": 6, "resaved": True})
    monkeypatch.setattr("core.checkpoint.os.replace", crash_after_moving_the_old_one_aside)
    with pytest.raises(KeyboardInterrupt):
        store.commit(tmp, 6)
    monkeypatch.setattr("core.checkpoint.os.replace", real_replace)
    found = store.resolve("auto")
    assert found is not None and ".replaced-" in found.name and verify(found) == ""
    save_with_files(store, 7)  # the next save completes, then the leftovers go
    assert [p.name for p in store.complete()] == ["step_00000007"]
    assert not list(tmp_path.glob("*.replaced-*")) and not list(tmp_path.glob("*.partial-*"))


def test_a_half_pruned_folder_is_never_taken_for_a_checkpoint(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, keep_last=1)
    save_with_files(store, 1)

    def die_half_way(path, ignore_errors=False):
        (path / "learner" / "model.bin").unlink()
        raise KeyboardInterrupt("killed while pruning")

    monkeypatch.setattr("core.checkpoint.shutil.rmtree", die_half_way)
    tmp = store.begin(2)
    write_json(tmp / "coordinator.json", {"step": 2})
    with pytest.raises(KeyboardInterrupt):
        store.commit(tmp, 2)
    monkeypatch.undo()
    assert [p.name for p in store.complete()] == ["step_00000002"]  # the half-deleted step 1 is not one
    assert store.resolve("auto") == store.path_of(2)
    # An older layout's half-pruned folder (marker kept, files gone) fails verification instead.
    legacy = store.path_of(0)
    legacy.mkdir()
    write_json(legacy / MARKER, {"step": 0, "files": {"coordinator.json": [10, "00"]}})
    assert verify(legacy) == "coordinator.json is missing"


def test_torn_jsonl_lines_are_dropped_on_resume(tmp_path, caplog):
    from launch.job.session import _truncate_jsonl

    path = tmp_path / "trained.jsonl"
    path.write_text('{"step": 1, "groups": ["a"]}\n{"step": 2, "groups": ["b"]}\n{"step": 3, "gro')
    with caplog.at_level(logging.WARNING):
        _truncate_jsonl(path, max_step=2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert "cut short" in caplog.text
