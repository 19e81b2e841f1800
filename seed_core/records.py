"""On-disk records passed between stages: Step, Trajectory, Skill.

Records are plain dataclasses written as JSON lines. Every file goes through `atomic_write_text` and every
folder through `publish_dir`: both write under a temporary name and rename, so a killed stage never leaves a
half-written output behind. RL run folders hold one `epoch_NNN/` per checkpointed epoch (`epoch_dir`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar


@dataclass
class Step:
    """One agent turn: the state it saw, what it generated, and what the environment answered."""

    observation: str  # raw environment observation the agent acted on
    admissible_actions: list[str]  # the environment's list, minus `help`
    prompt: str  # the rendered user message (before the chat template)
    response: str  # decoded response text
    response_ids: list[int]  # sampled response token ids (after the chat template's assistant header)
    response_logprobs: list[float]  # log pi(token | prompt, previous tokens) of each sampled token, T=1
    action: str  # parsed action sent to the environment (lower-cased); the raw response when invalid
    valid: bool  # both tag pairs present, no CJK
    reward: float  # 10*won on the final step, minus the invalid-format penalty
    feedback: str  # environment observation after the action


@dataclass
class Trajectory:
    """One finished episode. A GRPO group is all trajectories sharing `group_id` (same game)."""

    traj_id: str
    game_id: str
    split: str
    task_type: str
    task: str  # the task sentence ("put a clean apple in fridge.")
    group_id: str
    sample_idx: int
    won: bool
    episode_return: float
    length: int
    invalid_count: int
    steps: list[Step] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["steps"] = [Step(**s) for s in d.get("steps", [])]
        return cls(**d)


@dataclass
class Skill:
    """One hindsight skill written by an analyzer for one trajectory."""

    traj_id: str
    game_id: str
    task_type: str
    outcome: str  # "success" | "failure"
    summary: str
    skill: str
    parse_status: str  # "ok" | "ok_after_reask" | "failed" | "dropped" (teacher error)
    raw_output: str
    producer: str  # teacher name, or model name + checkpoint hash
    prompt_hash: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Skill:
        return cls(**d)


R = TypeVar("R", Trajectory, Skill)


ERROR_PREFIX = "error: "
"""The user-error contract between processes: a command that refuses its input prints one line starting so on
stderr and exits 2 (`exit_with_error`); `flows/pipeline.py` finds these lines in a stage's output."""


def exit_with_error(e: Exception | str, code: int = 2) -> NoReturn:
    """One `error: <message>` line on stderr, then exit with `code` (2: bad input, no traceback)."""
    print(f"{ERROR_PREFIX}{e}", file=sys.stderr)
    sys.exit(code)


class DataError(RuntimeError):
    """Input data missing, incomplete or changed (game files, manifests, an earlier stage's output); the message
    says how to fix it."""


class StorageError(OSError):
    """An output that could not be written (disk full, read-only or unwritable folder); the message names the
    path, the cause and the fix. The previous file, if any, is left as it was. `errno` is the cause's."""

    def __str__(self) -> str:
        return str(self.strerror)


def storage_error(path: str | os.PathLike, e: BaseException) -> StorageError:
    """A StorageError for a failed write of `path`, from the OSError (or an error whose text carries one)."""
    code = getattr(e, "errno", None)
    text = str(e)
    if code is None:  # e.g. safetensors' SafetensorError("... No space left on device (os error 28)")
        code = next(
            (
                c
                for c in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES)
                if f"(os error {c})" in text
            ),
            None,
        )
    folder = Path(path).parent
    if code in (errno.ENOSPC, errno.EDQUOT):
        why = f"the disk is full (no space left on the filesystem of {folder}); free space there and re-run the stage"
    elif code == errno.EFBIG:
        why = "the file size limit of this process is reached (as good as a full disk); raise `ulimit -f` and re-run the stage"
    elif code == errno.EROFS:
        why = f"{folder} is on a read-only filesystem; make it writable (or write the outputs elsewhere) and re-run the stage"
    elif code in (errno.EACCES, errno.EPERM):
        why = f"permission denied in {folder}; make it writable for this user and re-run the stage"
    else:
        why = f"{text}; fix the cause and re-run the stage"
    return StorageError(code, f"cannot write {path}: {why} (anything written there before is unchanged)")


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder and an atomic rename.

    A failure (disk full, read-only folder) leaves the previous file as it was and no temp file behind, and is
    raised as a StorageError that names the path and the cause."""
    path = Path(path)
    tmp = None
    created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]  # folders made here, innermost first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break
        if isinstance(e, OSError) and not isinstance(e, StorageError):
            raise storage_error(path, e) from e
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


# Groups of keys that measure this run rather than its result (`time/train_s`, `sft/time/train_s`,
# `memory/peak_rss_mb`): they differ on every run, so no hashed output holds them.
TIMING_GROUPS = frozenset({"time", "memory"})


def is_timing(key: str) -> bool:
    return not TIMING_GROUPS.isdisjoint(key.split("/")[:-1])


def split_timing(metrics: dict) -> tuple[dict, dict]:
    """(results, timing) of one metrics dict: timing holds the keys in a `time/` or `memory/` group (and `update`)."""
    timing = {k: v for k, v in metrics.items() if is_timing(k) or k == "update"}
    return {k: v for k, v in metrics.items() if not is_timing(k)}, timing


def timing_path(path: str | os.PathLike) -> Path:
    """Where the timings of a metrics file go: the same name under `time/` beside it (metrics/time/warmup.json)."""
    return Path(path).parent / "time" / Path(path).name


def write_metrics(path: str | os.PathLike, metrics: dict | list[dict]) -> None:
    """Write a stage's metrics (a dict, or a list of per-update dicts) to `path` less its timings, and the timings
    to `timing_path(path)`, so that two runs of the same code, data and parameters write identical metrics files
    and differ in the timing files only (README, "Did I get what you got?")."""
    if isinstance(metrics, dict):
        results, timing = split_timing(metrics)
    else:
        pairs = [split_timing(m) for m in metrics]
        results, timing = [r for r, _ in pairs], [t for _, t in pairs]
    write_json(path, results)
    write_json(timing_path(path), timing)


def write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> None:
    """Write dataclass records (or dicts) as JSON lines, atomically."""
    lines = []
    for r in records:
        d = dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r
        lines.append(json.dumps(d, ensure_ascii=False))
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_jsonl(path: str | os.PathLike, cls: type[R]) -> Iterator[R]:
    """Read records written by `write_jsonl`; a corrupt line (or bytes that are not UTF-8) is an error naming
    the file and line."""

    def corrupt(i: int, e: Exception) -> ValueError:
        return ValueError(
            f"{path}:{i} is not a valid {cls.__name__} record ({type(e).__name__}: {e}); "
            "delete the file and re-run the stage that writes it (`dvc repro`)."
        )

    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise corrupt(i, e) from e
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise TypeError(f"a JSON {type(d).__name__}, not an object")
                record = cls.from_dict(d)
            except (ValueError, TypeError, AttributeError, KeyError) as e:  # JSONDecodeError is a ValueError
                raise corrupt(i, e) from e
            yield record


def publish_dir(out_dir: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp)` on a fresh temp folder beside `out_dir`, then rename it to `out_dir` (replacing it).

    Every stage that writes a folder goes through here. A failure anywhere (in `write`, disk full, read-only
    folder, an interrupt) leaves no temp folder behind and the previous `out_dir`, if any, as it was; an OSError
    is raised as a StorageError naming the folder and the fix."""
    out_dir = Path(out_dir)
    tmp = None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
        write(tmp)
        tmp.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except OSError as e:
        if isinstance(e, StorageError):
            raise
        raise storage_error(out_dir, e) from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


_EPOCH = re.compile(r"^epoch_(\d{3})$")


def epoch_dir(run_dir: str | os.PathLike, epoch: int) -> Path:
    """`<run_dir>/epoch_NNN`: the folder of one checkpointed RL epoch (1-based)."""
    return Path(run_dir) / f"epoch_{epoch:03d}"


def epoch_of(path: str | os.PathLike) -> int | None:
    """The epoch number of an `epoch_NNN` folder, or None when `path` is not one."""
    m = _EPOCH.match(Path(path).name)
    return int(m.group(1)) if m else None


def epoch_dirs(run_dir: str | os.PathLike, upto: int | None = None) -> list[Path]:
    """The complete epoch folders of a run (those with a state.json), in order; with `upto`, epochs 1..upto."""
    done = sorted(p for p in Path(run_dir).glob("epoch_[0-9][0-9][0-9]") if (p / "state.json").exists())
    return [p for p in done if upto is None or epoch_of(p) <= upto]
