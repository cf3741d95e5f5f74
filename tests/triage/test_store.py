"""The triage store: results survive, stale ones go, a foreign or broken file is handled."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from oomlens.errors import UsageError
from oomlens.triage import store
from oomlens.triage.store import FileRecord, ResultStore, StoredResult, run_key


def _result(key: str, run_id: str = "run-a", error: str | None = None) -> StoredResult:
    report = None if error else {"verdict": "gpu_oom", "diagnoses": [{"id": "fragmentation"}]}
    return StoredResult(key, run_id, report, error, None, 0.5)


def test_results_and_file_records_survive_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "store.sqlite")
    with ResultStore(path) as store:
        store.put_result(_result("k1"), analyzer="a")
        store.put_result(_result("k2", "run-b", error="no usable input: x"), analyzer="a")
        store.put_files([("/x/train.log", FileRecord(10, 20, 30, "ab" * 32, True))])
    with ResultStore(path) as store:
        found = store.get_results(["k1", "k2", "k3"])
        files = store.load_files()
    assert set(found) == {"k1", "k2"}
    assert found["k1"].report == {"verdict": "gpu_oom", "diagnoses": [{"id": "fragmentation"}]}
    assert found["k2"].error == "no usable input: x" and found["k2"].report is None
    assert files == {"/x/train.log": FileRecord(10, 20, 30, "ab" * 32, True)}


def test_a_new_result_replaces_the_run_s_old_one(tmp_path: Path) -> None:
    with ResultStore(str(tmp_path / "s.sqlite")) as store:
        store.put_result(_result("old"), analyzer="a")
        store.put_result(_result("other", "run-b"), analyzer="a")
        store.put_result(_result("new"), analyzer="a")
        assert set(store.get_results(["old", "new", "other"])) == {"new", "other"}
        assert store.count_results() == 2


def test_a_store_of_another_schema_is_emptied(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sqlite")
    with ResultStore(path) as store:
        store.put_result(_result("k1"), analyzer="a")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '0' WHERE name = 'schema'")
    db.close()
    with ResultStore(path) as store:
        assert store.get_results(["k1"]) == {}


@pytest.mark.parametrize("content", [b"not a database at all, just text" * 100, b""])
def test_a_file_that_is_not_a_store_is_refused_or_adopted(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "s.sqlite"
    path.write_bytes(content)
    if content:
        with pytest.raises(UsageError, match="not a usable triage store"):
            ResultStore(str(path))
    else:  # an empty file is an empty database
        with ResultStore(str(path)) as store:
            assert store.count_results() == 0


def test_a_damaged_store_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    with ResultStore(str(path)) as store:
        for i in range(200):
            store.put_result(_result(f"k{i}", f"run-{i}"), analyzer="a")
    data = bytearray(path.read_bytes())
    data[4096 * 2 : 4096 * 4] = b"\xff" * (4096 * 2)  # trash two pages after the header
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="delete it or pass another --store"):
        ResultStore(str(path))


def test_run_keys_follow_content_paths_analyzer_and_config() -> None:
    files = [("train.log", "a" * 64), ("snapshot_rank0.pickle", "b" * 64)]
    base = run_key("oomlens 1", None, "/runs/x", files)
    assert run_key("oomlens 1", None, "/runs/x", list(reversed(files))) == base
    assert (
        run_key("oomlens 1", None, "/runs/x", [files[0], ("snapshot_rank1.pickle", "b" * 64)])
        != base
    )
    assert (
        run_key("oomlens 1", None, "/runs/x", [files[0], ("snapshot_rank0.pickle", "c" * 64)])
        != base
    )
    assert run_key("oomlens 2", None, "/runs/x", files) != base
    assert run_key("oomlens 1", "/c.json\0" + "d" * 64, "/runs/x", files) != base
    assert run_key("oomlens 1", None, "/runs/y", files) != base


@pytest.mark.parametrize("where", ["missing/s.sqlite", "a-file/s.sqlite"])
def test_a_store_that_cannot_be_created_says_so_and_names_no_file_to_delete(
    tmp_path: Path, where: str
) -> None:
    # A read-only directory is the usual case; root may write anywhere, so the tests use the
    # other reasons SQLite reports the same way ("unable to open database file").
    (tmp_path / "a-file").write_text("")
    path = tmp_path / where
    with pytest.raises(UsageError, match="the triage store cannot be created in") as raised:
        ResultStore(str(path))
    assert "delete it" not in raised.value.message
    assert not path.exists()


def test_a_read_only_directory_is_named_as_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*_args: object) -> int:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(store.os, "open", read_only)
    with pytest.raises(UsageError, match=r"cannot be created in .*\(Read-only file system\)"):
        ResultStore(str(tmp_path / "s.sqlite"))
