"""Launch and watch the RL stage's ranks (`rl.launcher: torchrun`).

The launching process (the Prefect `rl` flow, or `seed_core.stages.rl.train`) starts `rl.world_size` rank processes
on this node with torchrun, streams their output into its own log, and reports each epoch as its folder is published
(folders appear atomically, so a folder that exists is complete). Ranks never import Prefect. torchrun stops every
rank as soon as one dies, and the launcher then raises a RankError naming the rank and its exit code; the next run
resumes after the last complete epoch, on any number of ranks.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from seed_core.records import epoch_dir


class RankError(RuntimeError):
    """A rank process failed (an error, or killed); the run stopped after its last complete epoch."""


def torchrun_command(world_size: int, params: Path, init_dir: Path, manifest_dir: Path, run_dir: Path) -> list[str]:
    """torchrun on this node (a free port of its own, no restarts: a failed rank stops the run) over the rank program."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
        "--max-restarts=0", "-m", "seed_core.stages.rl", "--params", str(params), "--init", str(init_dir),
        "--manifest-dir", str(manifest_dir), "--run-dir", str(run_dir),
    ]  # fmt: skip


# torchrun's failure summary: "rank      : 1 (local_rank: 1)" then "exitcode  : -9 (pid: 123)"
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def describe_failure(output: str, returncode: int) -> str:
    """Which rank failed and how, from torchrun's summary (its root cause first)."""
    root = output[output.find("Root Cause") :] if "Root Cause" in output else output
    m = _FAILURE.search(root)
    if not m:
        return f"torchrun exited with code {returncode}"
    rank, code = int(m.group(1)), int(m.group(2))
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return f"rank {rank} died ({how})"


def run_ranks(
    command: list[str], run_dir: Path, pending: list[int], log: Callable[[str], None] = print, poll_s: float = 1.0
) -> Iterator[int]:
    """Run `command` (the rank processes) and yield each epoch of `pending` once its folder is published. Raises
    RankError when the ranks fail or stop short of the last epoch; stops them if the caller stops early."""
    tail: collections.deque[str] = collections.deque(maxlen=400)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def pump() -> None:
        for line in proc.stdout:
            tail.append(line)
            log(line.rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    left = list(pending)
    try:
        while left:
            if epoch_dir(run_dir, left[0]).is_dir():
                yield left.pop(0)
            elif proc.poll() is not None:
                break
            else:
                time.sleep(poll_s)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    reader.join()
    if code != 0:
        raise RankError(
            f"{describe_failure(''.join(tail), code)} in the rl stage; the run stopped after its last complete epoch "
            f"in {run_dir}. Re-run the stage (`dvc repro rl`) to resume from there; the log above has the rank's error"
        )
    if left:
        raise RankError(f"the ranks exited without writing epochs {left} of {run_dir}; see the log above")
