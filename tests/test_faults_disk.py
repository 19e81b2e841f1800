"""Fault injection, disk: the output folder's disk is full, or the folder is read-only, while the stage's
writers (records.atomic_write_text / write_json / write_jsonl and the RL checkpoint writer rl.save_epoch)
replace outputs of an earlier run. Each write fails with an error naming the path and the cause, the earlier
outputs stay byte-identical, and no temp file or folder is left behind.

As root (chmod does not stop root) the faults are real filesystems: a small tmpfs filled to the last page
(ENOSPC) and a read-only bind mount (EROFS), always unmounted afterwards. Otherwise: a file-size limit in a
subprocess (EFBIG, SIGXFSZ ignored) and a folder without write permission (EACCES)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from faultsuite import intact

pytestmark = pytest.mark.e2e  # subprocesses on full disks

TESTS = Path(__file__).resolve().parent
BIG = "x" * 2_000_000  # more than any free space left below


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def can_mount(tmp: Path) -> bool:
    """Root with mount rights: try a throwaway tmpfs."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = tmp / ".mount-probe"
    probe.mkdir()
    ok = _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
    if ok:
        _umount(probe)
    probe.rmdir()
    return ok


def previous_outputs(folder: Path, trainer) -> None:
    """What an earlier run left: a metrics file, a record file, a preview, and an RL epoch checkpoint."""
    from seed_core.records import atomic_write_text, write_json, write_jsonl
    from seed_core.stages.rl import save_epoch

    write_json(folder / "metrics.json", {"success": 0.5})
    write_jsonl(folder / "skills.jsonl", [{"traj_id": "t0", "skill": "Look first."}])
    atomic_write_text(folder / "report.md", "# earlier report\n")
    save_epoch(trainer, folder / "run", 1, [], [{"update": 0}], {})


def attempt_writes(folder: Path, trainer) -> dict[str, str]:
    """Replace every earlier output, and write a new epoch and a new file in a new folder; returns each
    writer's error message ("" when a write unexpectedly succeeded)."""
    from seed_core.records import StorageError, atomic_write_text, write_json, write_jsonl
    from seed_core.stages.rl import save_epoch

    attempts = {
        "atomic_write_text": lambda: atomic_write_text(folder / "report.md", BIG),
        "write_json": lambda: write_json(folder / "metrics.json", {"success": BIG}),
        "write_jsonl": lambda: write_jsonl(
            folder / "skills.jsonl", [{"traj_id": f"t{i}", "skill": BIG} for i in range(2)]
        ),
        "new_folder": lambda: write_json(folder / "metrics" / "eval.json", {"success": BIG}),
        "save_epoch": lambda: save_epoch(trainer, folder / "run", 2, [{"skill": BIG}], [{"update": 1}], {}),
    }
    out = {}
    for name, write in attempts.items():
        try:
            write()
            out[name] = ""
        except StorageError as e:
            out[name] = str(e)
    return out


def tiny_trainer(model_dir: str):
    from seed_core.config import params_from_dict
    from seed_core.method.update import Trainer
    from seed_core.models import load_model

    model, tok = load_model(model_dir)
    return Trainer(model, tok, params_from_dict({"rl": {"method": "grpo"}}))


# The non-root fallback: the same writes in a child process that may not write files beyond a size limit.
CHILD = """
import json, resource, signal, sys
sys.path.insert(0, {tests!r})
import test_faults_disk as t
from pathlib import Path
trainer = t.tiny_trainer({model!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
print("RESULT " + json.dumps(t.attempt_writes(Path({folder!r}), trainer)))
"""


def attempt_in_child(folder: Path, model_dir: Path) -> dict[str, str]:
    code = CHILD.format(tests=str(TESTS), model=str(model_dir), folder=str(folder))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stdout + proc.stderr
    return json.loads(line[len("RESULT ") :])


@contextmanager
def full_tmpfs(mountpoint: Path, size: str):
    mountpoint.mkdir()
    assert _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint))
    try:
        yield mountpoint
    finally:
        _umount(mountpoint)


def fill(folder: Path) -> Path:
    """Fill the filesystem of `folder` to the last byte with a ballast file; returns it."""
    ballast = folder / "ballast"
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    for size in (4096, 512, 1):  # the last partial pages too
        try:
            with open(ballast, "ab") as f:
                while True:
                    f.write(b"\0" * size)
                    f.flush()
        except OSError:
            pass
    return ballast


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def check_refused(messages: dict[str, str], folder: Path, cause: str) -> None:
    expected_paths = {
        "atomic_write_text": folder / "report.md",
        "write_json": folder / "metrics.json",
        "write_jsonl": folder / "skills.jsonl",
        "new_folder": folder / "metrics" / "eval.json",
        "save_epoch": folder / "run" / "epoch_002",
    }
    for name, msg in messages.items():
        assert msg, f"{name}: the write succeeded"
        assert msg.startswith(f"cannot write {expected_paths[name]}"), (name, msg)
        assert cause in msg and "re-run the stage" in msg, (name, msg)
        assert "anything written there before is unchanged" in msg


@pytest.mark.fault("disk", n=5)
def test_disk_full(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(str(tiny_model_dir))
    if can_mount(tmp_path):
        with full_tmpfs(tmp_path / "fs", "16m") as fs:
            previous_outputs(fs, trainer)
            before = listing(fs)
            ballast = fill(fs)
            assert ballast.stat().st_size > 1_000_000
            with intact(fs):
                messages = attempt_writes(fs, trainer)
            check_refused(messages, fs, "the disk is full (no space left on the filesystem of")
            assert listing(fs) == sorted(before + ["ballast"])  # no temp file or folder left behind
            # Once space is freed, the same writes go through.
            ballast.unlink()
            assert attempt_writes(fs, trainer) == dict.fromkeys(messages, "")
            assert (fs / "run" / "epoch_002" / "state.json").exists()
    else:
        out = tmp_path / "out"
        previous_outputs(out, trainer)
        before = listing(out)
        with intact(out):
            messages = attempt_in_child(out, tiny_model_dir)
        check_refused(messages, out, "the file size limit of this process is reached")
        assert listing(out) == before


@pytest.mark.fault("disk", n=5)
def test_read_only_output_folder(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(str(tiny_model_dir))
    src = tmp_path / "out"
    previous_outputs(src, trainer)
    before = listing(src)
    if can_mount(tmp_path):
        ro = tmp_path / "ro"
        ro.mkdir()
        assert _mount("--bind", str(src), str(ro))
        try:
            assert _mount("-o", "remount,ro,bind", str(ro))
            with intact(ro):
                messages = attempt_writes(ro, trainer)
            check_refused(messages, ro, "is on a read-only filesystem; make it writable")
            assert listing(ro) == before
        finally:
            _umount(ro)
    else:
        for d in [src, *[p for p in src.rglob("*") if p.is_dir()]]:
            d.chmod(0o555)
        try:
            with intact(src):
                messages = attempt_writes(src, trainer)
            check_refused(messages, src, "permission denied in")
        finally:
            for d in [src, *[p for p in src.rglob("*") if p.is_dir()]]:
                d.chmod(0o755)
    assert listing(src) == before
    # Writable again: the same writes go through.
    assert attempt_writes(src, trainer) == dict.fromkeys(messages, "")
