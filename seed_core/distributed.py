"""SPMD ranks for the RL stage on PyTorch FSDP2: the same program on every rank, one process per GPU (or CPU
process), launched by `torchrun` on a node or by Ray Train across nodes (`seed_core.launch`).

What keeps a rank program correct, and where each piece lives:
- rank r plays games[r::world] of every update, whole GRPO groups, so group-normalized advantages stay
  rank-local (`Trainer.update`); each rank has its own sampler and its own game pool;
- every FSDP forward and backward is a collective, so every rank runs the same number of them: counts are
  agreed with `all_max` and a rank short of work runs zero-weight passes (`Trainer.optimize`, `HFPolicy.score`);
- the token-mean is global (`all_sum` of the response tokens) and "skip a non-finite step" is decided by all
  ranks together (`all_true`), never by a `break` on one rank;
- checkpoints are full state dicts gathered to rank 0 and loaded by a broadcast from rank 0 (`stages.rl`).

World size 1 (no process group) is the local run: every helper here is then the identity, so the single-process
path and the rank path are one code path.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

RANK_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and Ray Train) set for every rank."""


def active() -> bool:
    """Whether this process is a rank of a launch (torchrun, Ray Train): a process group and the rank environment.
    A group alone is not: vLLM's in-process CPU engine makes its own (world 1, no `RANK`), under which a local run
    would shard its learner with FSDP2 over a world of one and give up the unsharded scoring paths."""
    return dist.is_available() and dist.is_initialized() and all(k in os.environ for k in RANK_ENV)


def world() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def is_main() -> bool:
    return rank() == 0


def init(timeout_s: float = 600.0) -> bool:
    """Join the process group described by torchrun's environment (NCCL on CUDA, else gloo); returns whether it was
    made here (Ray Train makes its own before the rank program starts). `timeout_s` bounds every collective, so a
    rank that died mid-update stops the others instead of hanging them."""
    if active():
        return False
    missing = [k for k in RANK_ENV if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"no rank environment ({', '.join(missing)} unset): start rank programs with torchrun or Ray Train "
            "(`rl.launcher`), not directly"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def close() -> None:
    if active():
        dist.destroy_process_group()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _reduce(x: float, op) -> float:
    if not active():
        return x
    t = torch.tensor([float(x)], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op)
    return float(t.item())


def all_sum(x: float) -> float:
    """Sum of `x` over ranks."""
    return _reduce(x, dist.ReduceOp.SUM)


def all_max(n: int) -> int:
    """Largest `n` of any rank: how many collective passes every rank must run."""
    return int(_reduce(n, dist.ReduceOp.MAX))


def all_true(flag: bool) -> bool:
    """True on every rank iff true on every rank."""
    return bool(_reduce(float(flag), dist.ReduceOp.MIN))


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (picklable objects: trajectories, metrics, skill corpora)."""
    if not active():
        return [obj]
    out: list = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's `obj` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def full(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor (DTensor) gathered whole on every rank (a collective); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def on_main(fn):
    """`fn()` on rank 0 only (writing a checkpoint, reading one); returns its result there and None elsewhere. An
    error on rank 0 is raised on every rank (elsewhere as a RuntimeError naming it), so no rank waits forever."""
    result, error = None, None
    if is_main():
        try:
            result = fn()
        except Exception as e:  # re-raised below, after every rank knows
            error = e
    message = broadcast(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"rank 0 failed: {message}")
    return result


def barrier() -> None:
    if active():
        dist.barrier()


def shard(root: torch.nn.Module, model: torch.nn.Module) -> None:
    """FSDP2 over `root`, a module whose forward runs all of `model`'s scoring (decoder and chunked head): one unit
    per transformer block (the model's `_no_split_modules`) and `root` for the rest, so embeddings, final norm and
    a head tied to the embeddings share one unit that `root`'s forward gathers. On CUDA blocks compute in bf16 over
    fp32 master weights, with fp32 gradient reductions; the CPU computes in the weights' dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = set(getattr(base, "_no_split_modules", None) or ())
    if not blocks:
        raise ValueError(f"{type(base).__name__} names no transformer block (`_no_split_modules`) to shard by")
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if torch.cuda.is_available()
        else MixedPrecisionPolicy()
    )
    for m in model.modules():
        if type(m).__name__ in blocks:
            fully_shard(m, mp_policy=mp)
    fully_shard(root, mp_policy=mp)


@contextlib.contextmanager
def gathered(root: torch.nn.Module) -> Iterator[None]:
    """Inside: every FSDP unit under `root` holds its full parameters (plain tensors), e.g. to copy weights into a
    rank's sampler; a no-op for an unsharded module."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    for u in units:
        u.unshard()
    try:
        yield
    finally:
        for u in units:
            u.reshard()
