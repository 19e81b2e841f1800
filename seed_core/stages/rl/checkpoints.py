"""An epoch's folder: `save_epoch` publishes the trainable weights, optimizer state, skill corpus and metrics as
`epoch_NNN/`; `load_epoch` restores a trainer from one, on any number of ranks."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from seed_core import distributed
from seed_core.method.update import NonFiniteError, Trainer
from seed_core.models import ModelError
from seed_core.records import epoch_dir, epoch_of, publish_dir, split_timing, storage_error, write_json, write_jsonl


def epoch_summary(run_dir: Path, epoch: int) -> dict:
    """An epoch's last update and its validation, from its folder."""
    m = json.loads((epoch_dir(run_dir, epoch) / "metrics.json").read_text())
    return {"epoch": epoch, **(m["updates"][-1] if m["updates"] else {}), **m["validation"]}


def save_epoch(
    trainer: Trainer, run_dir: Path, epoch: int, corpus: list[dict], updates: list[dict], validation: dict
) -> Path:
    """Publish one epoch's checkpoint, skill corpus and metrics as `epoch_NNN/` (`records.publish_dir`).

    Every rank calls it: the trainable weights and the optimizer state are gathered whole to rank 0 (DCP's
    state-dict API, keyed by parameter name, so any number of ranks can resume them), which writes the folder.
    A failure (non-finite weights, disk full, read-only folder) leaves no temp folder and every earlier epoch
    as it was, and is raised on every rank."""
    final = epoch_dir(run_dir, epoch)
    weights = {
        k: distributed.full(v).detach().cpu().contiguous()
        for k, v in trainer.model.named_parameters()
        if v.requires_grad
    }
    if not all(torch.isfinite(v).all() for v in weights.values()):
        raise NonFiniteError("refusing to checkpoint non-finite weights")
    optim = get_optimizer_state_dict(
        trainer.model, trainer.opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )

    def write(tmp: Path) -> None:
        opt_state, opt_meta = {}, {}
        for name, st in optim["state"].items():
            for k, v in st.items():
                if torch.is_tensor(v) and v.dim() > 0:
                    opt_state[f"{name}.{k}"] = v.contiguous()
                else:
                    opt_meta[f"{name}.{k}"] = float(v)
        for name, tensors in (("trainable.safetensors", weights), ("optimizer.safetensors", opt_state)):
            try:
                save_file(tensors, tmp / name)
            except Exception as e:  # SafetensorError carries the OS error only in its text
                if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
                    raise
                raise storage_error(final / name, e) from e
        write_jsonl(tmp / "skills.jsonl", corpus)
        # timings apart from results: runs/rl's hash is then the same for two runs of the same parameters
        # (.dvcignore keeps timing.json out of it)
        split = [split_timing(u) for u in updates]
        write_json(tmp / "metrics.json", {"updates": [r for r, _ in split], "validation": validation})
        write_json(tmp / "timing.json", [t for _, t in split])
        state = {
            "epoch": epoch,
            "optimizer_scalars": opt_meta,
            "optimizer_groups": optim["param_groups"],
            "nonfinite_in_row": trainer.nonfinite_in_row,
        }
        write_json(tmp / "state.json", state)

    distributed.on_main(lambda: publish_dir(final, write))
    return final


def load_epoch(trainer: Trainer, epoch_dir: Path) -> None:
    """Restore weights, optimizer state and counters from an epoch folder: rank 0 reads it and every rank takes its
    shard from rank 0's broadcast. An unreadable or incomplete folder is a ModelError on every rank saying to delete
    it, so a run never resumes from wrong weights."""
    trainable = {k for k, p in trainer.model.named_parameters() if p.requires_grad}

    def read() -> tuple[dict, dict, int]:
        try:
            weights = load_file(epoch_dir / "trainable.safetensors")
            missing, unexpected = sorted(trainable - set(weights)), sorted(set(weights) - trainable)
            if missing or unexpected:
                raise KeyError(
                    f"its tensors do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
                )
            state = json.loads((epoch_dir / "state.json").read_text())
            optim: dict[str, dict] = {}
            for key, v in load_file(epoch_dir / "optimizer.safetensors").items():
                name, k = key.rsplit(".", 1)
                optim.setdefault(name, {})[k] = v
            for key, v in state["optimizer_scalars"].items():
                name, k = key.rsplit(".", 1)
                optim.setdefault(name, {})[k] = torch.tensor(v)
            return weights, {"state": optim, "param_groups": state["optimizer_groups"]}, int(state["nonfinite_in_row"])
        except Exception as e:  # SafetensorError, OSError, JSONDecodeError, KeyError, ...
            n = epoch_of(epoch_dir) or 0
            resume = f"resumes after epoch_{n - 1:03d}" if n > 1 else "starts again from the initial model"
            raise ModelError(
                f"checkpoint {epoch_dir} is unreadable ({type(e).__name__}: {e}); delete {epoch_dir} and re-run the rl "
                f"stage (`dvc repro rl`): it {resume} and trains that epoch again"
            ) from e

    weights, optim, nonfinite = distributed.on_main(read) or ({}, {}, 0)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed.world() > 1, strict=False)
    set_model_state_dict(trainer.model, weights, options=options)
    set_optimizer_state_dict(trainer.model, trainer.opt, optim, options=options)
    trainer.nonfinite_in_row = distributed.broadcast(nonfinite)
