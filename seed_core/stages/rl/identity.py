"""The run's identity: the folder a parameter set trains in (`<method>-<advantage>-s<seed>-<hash>`, the hash of the
parameters that shape the run and of the starting weights), and the check that a resumed run is the same run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
from dataclasses import dataclass
from pathlib import Path

from seed_core import distributed
from seed_core.config import Params
from seed_core.models import ModelError
from seed_core.records import epoch_dirs, write_json

# rl.init -> the checkpoint RL starts from (the dvc.yaml outputs of train_analyzer, warmup and prepare).
INIT = {"analyzer": "models/analyzer", "warmup": "models/warmup", "base": "models/base"}


@dataclass(frozen=True)
class Paths:
    """The stage's files, the defaults of the flow and of the rank program (dvc.yaml declares the same:
    tests/unit/test_structure.py keeps them equal)."""

    params: str = "params.yaml"
    manifest_dir: str = "data/manifests"
    runs_dir: str = "runs/rl"  # one folder per parameter set (`run_folder_name`)
    out_dir: str = "models/rl"
    metrics: str = "metrics/rl.json"
    plots: str = "metrics/rl_updates.json"


PATHS = Paths()


def fingerprint(params: Params, init_dir: Path) -> dict:
    """What a resumed run must share with the run that wrote the checkpoints."""
    relevant = {k: dataclasses.asdict(getattr(params, k)) for k in ("model", "env", "rollout", "rl")}
    for key in ("epochs", "launcher", "world_size", "ray_address"):  # more epochs; resume on any number of ranks
        relevant["rl"].pop(key)
    relevant = json.loads(json.dumps(relevant))  # as run.json stores it (tuples become lists)
    weights = sorted(init_dir.glob("*.safetensors"))
    if not weights:
        raise ModelError(f"no starting model in {init_dir}; run the stage that writes it (`dvc repro`)")
    init = hashlib.sha256(b"".join(hashlib.sha256(w.read_bytes()).digest() for w in weights)).hexdigest()
    return {"params": relevant, "init_model_sha256": init}


def run_folder_name(params: Params, init_dir: Path) -> str:
    """`<method>-<advantage>-s<seed>-<hash of the fingerprint>`: one folder per parameter set."""
    digest = hashlib.sha256(json.dumps(fingerprint(params, init_dir), sort_keys=True).encode()).hexdigest()[:10]
    return f"{params.rl.method}-{params.rl.advantage}-s{params.rl.seed}-{digest}"


def diff_params(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += diff_params(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def open_run_dir(params: Params, init_dir: Path, run_dir: Path) -> list[int]:
    """Create or reopen a run folder (its run.json is the fingerprint); returns the epochs left to train. Refuses a
    folder whose epochs were made under different parameters, naming what changed."""
    fp, fp_path = fingerprint(params, init_dir), run_dir / "run.json"

    def check_or_create() -> None:  # on rank 0 alone: the ranks must not race on the file
        if fp_path.exists():
            old = json.loads(fp_path.read_text())
            if old != fp:
                changes = "; ".join(diff_params(old, fp)) or "the starting model changed"
                raise ValueError(
                    f"{run_dir} holds epochs of a run made under different parameters ({changes}); "
                    f"delete {run_dir} to start over, or restore the parameters to resume"
                )
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json(fp_path, fp)

    distributed.on_main(check_or_create)
    # Every rank reads the starting model and writes nothing but through rank 0: all must see the same folders.
    seen = distributed.gather((socket.gethostname(), fp_path.exists() and init_dir.exists()))
    blind = [f"rank {r} on {host}" for r, (host, ok) in enumerate(seen) if not ok]
    if blind:
        raise ModelError(
            f"{', '.join(blind)} cannot see {run_dir} or {init_dir}: runs/ and models/ must be on a filesystem every "
            "node sees (NFS, Lustre, ...), at the same path"
        )
    return list(range(len(epoch_dirs(run_dir, params.rl.epochs)) + 1, params.rl.epochs + 1))
