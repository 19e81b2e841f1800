"""The one atomic folder publish every stage uses, the epoch-folder names of RL runs, and metrics files."""

import errno
import json
import os

import pytest

from seed_core.records import StorageError, epoch_dir, epoch_dirs, epoch_of, publish_dir, write_metrics


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_publish_replaces_the_folder_whole(tmp_path):
    out = tmp_path / "models" / "m"
    publish_dir(out, lambda tmp: (tmp / "a.txt").write_text("1"))
    publish_dir(out, lambda tmp: (tmp / "b.txt").write_text("2"))
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # replaced, not merged
    assert oct(out.stat().st_mode & 0o777) == "0o755" and leftovers(out.parent) == []


@pytest.mark.parametrize("error", [RuntimeError("bug in write"), KeyboardInterrupt()])
def test_a_failing_write_leaves_the_old_folder_and_no_temp(tmp_path, error):
    out = tmp_path / "m"
    publish_dir(out, lambda tmp: (tmp / "old.txt").write_text("old"))

    def write(tmp):
        (tmp / "half.txt").write_text("half")
        raise error

    with pytest.raises(type(error)):
        publish_dir(out, write)
    assert (out / "old.txt").read_text() == "old" and not (out / "half.txt").exists()
    assert leftovers(tmp_path) == []


def test_an_os_error_is_a_storage_error_naming_the_folder_and_fix(tmp_path):
    out = tmp_path / "m"

    def write(tmp):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(StorageError) as e:
        publish_dir(out, write)
    assert str(e.value).startswith(f"cannot write {out}: the disk is full") and "re-run the stage" in str(e.value)
    assert e.value.errno == errno.ENOSPC and not out.exists() and leftovers(tmp_path) == []


def test_epoch_folders(tmp_path):
    assert epoch_dir(tmp_path, 7) == tmp_path / "epoch_007"
    assert (epoch_of(tmp_path / "epoch_012"), epoch_of("epoch_1"), epoch_of(".epoch_001.x.tmp")) == (12, None, None)
    for n, complete in ((1, True), (2, True), (3, False), (4, True)):
        epoch_dir(tmp_path, n).mkdir()
        if complete:
            (epoch_dir(tmp_path, n) / "state.json").write_text("{}")
    (tmp_path / "epoch_x").mkdir()
    assert [p.name for p in epoch_dirs(tmp_path)] == ["epoch_001", "epoch_002", "epoch_004"]
    assert [p.name for p in epoch_dirs(tmp_path, upto=2)] == ["epoch_001", "epoch_002"]


def test_metrics_files_keep_timings_apart(tmp_path):
    """Results to the named file; keys in a time/ or memory/ group to metrics/time/ under the same name (per-update
    rows keep their update number in both), so that two runs of the same code differ in the timing files only."""
    path = tmp_path / "metrics" / "warmup.json"
    metrics = {"train/loss": 1.5, "time/train_s": 30.2, "sft/time/train_s": 6.1, "memory/peak_rss_mb": 900}
    write_metrics(path, {**metrics, "timeline": 3, "sft/time": 4})
    assert json.loads(path.read_text()) == {"train/loss": 1.5, "timeline": 3, "sft/time": 4}
    assert json.loads((tmp_path / "metrics/time/warmup.json").read_text()) == {
        "time/train_s": 30.2,
        "sft/time/train_s": 6.1,
        "memory/peak_rss_mb": 900,
    }
    rows = [{"update": 0, "loss/pg": 0.1, "time/update_s": 4.0}, {"update": 1, "loss/pg": 0.2}]
    write_metrics(tmp_path / "metrics" / "rl_updates.json", rows)
    assert json.loads((tmp_path / "metrics/rl_updates.json").read_text()) == [
        {"update": 0, "loss/pg": 0.1},
        {"update": 1, "loss/pg": 0.2},
    ]
    assert json.loads((tmp_path / "metrics/time/rl_updates.json").read_text()) == [
        {"update": 0, "time/update_s": 4.0},
        {"update": 1},
    ]
