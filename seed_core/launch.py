"""Launch and watch the RL stage's ranks (`rl.launcher: torchrun | ray`).

The launching process (the Prefect `rl` flow, or `seed_core.stages.rl.train`) starts `rl.world_size` rank processes
(torchrun on this node, or Ray Train workers on a Ray cluster), and reports each epoch as its folder is published
(folders appear atomically, so a folder that exists is complete); torchrun's output is streamed into its own log,
Ray's reaches the driver's. Ranks never import Prefect. When a rank dies the others are stopped and the launcher
raises a RankError (with torchrun, naming the rank and its exit code); the next run resumes after the last complete
epoch, on any number of ranks.
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


def torchrun_command(world_size: int, argv: list[str]) -> list[str]:
    """torchrun on this node (a free port of its own, no restarts: a failed rank stops the run) over the rank program
    (`seed_core.stages.rl` with `argv`)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
        "--max-restarts=0", "-m", "seed_core.stages.rl", *argv,
    ]  # fmt: skip


def _published(run_dir: Path, left: list[int], running: Callable[[], bool], poll_s: float) -> Iterator[int]:
    """Pop and yield each epoch of `left` as its folder appears, until none is left or the ranks stopped."""
    while left:
        if epoch_dir(run_dir, left[0]).is_dir():
            yield left.pop(0)
        elif not running():
            return
        else:
            time.sleep(poll_s)


def _ray_rank(config: dict) -> None:
    """One Ray Train worker: the rank program, in the launching process's folder (Ray Train made the process group)."""
    os.chdir(config["cwd"])
    config["entry"](config["argv"])


def ray_ranks(entry: Callable[[list[str]], None], argv: list[str], params, run_dir: Path, pending: list[int],
              log: Callable[[str], None] = print, poll_s: float = 1.0) -> Iterator[int]:  # fmt: skip
    """The rank program `entry(argv)` on `rl.world_size` Ray Train workers (`TorchTrainer`, one GPU each when the model runs on
    CUDA) of the cluster at `rl.ray_address` (null: a private local cluster); yields each epoch of `pending` once its
    folder is published. A failed worker raises RankError; Ray Train retries nothing (the next run resumes)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from seed_core.models import resolve_device

    if not ray.is_initialized():
        ray.init(address=params.rl.ray_address, include_dashboard=False, log_to_driver=True)
    trainer = TorchTrainer(
        _ray_rank,
        train_loop_config={"cwd": os.getcwd(), "entry": entry, "argv": argv},
        scaling_config=ScalingConfig(
            num_workers=params.rl.world_size, use_gpu=resolve_device(params.model.device) == "cuda"
        ),
        run_config=RunConfig(
            name=run_dir.name,
            storage_path=str((run_dir / "ray").resolve()),
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    outcome: dict = {}

    def fit() -> None:
        try:
            trainer.fit()
        except Exception as e:  # raised below, in the caller's thread
            outcome["error"] = e

    runner = threading.Thread(target=fit, daemon=True)
    runner.start()
    left = list(pending)
    yield from _published(run_dir, left, runner.is_alive, poll_s)
    runner.join()
    if "error" in outcome:
        raise RankError(
            f"a Ray Train worker failed in the rl stage ({outcome['error']}); the run stopped after its last complete "
            f"epoch in {run_dir}. Re-run the stage (`dvc repro rl`) to resume from there"
        ) from outcome["error"]
    if left:
        raise RankError(f"the Ray Train workers finished without writing epochs {left} of {run_dir}")


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
        yield from _published(run_dir, left, lambda: proc.poll() is None, poll_s)
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
