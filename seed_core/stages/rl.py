"""The `rl` stage: Stage 2 (`seed_core.method.update.Trainer`) for rl.epochs checkpointed, resumable epochs.

Each parameter set trains in its own run folder (`<method>-<advantage>-s<seed>-<hash>`, the hash of the
parameters that shape the run and of the starting weights). An epoch is `rl.updates_per_epoch` updates, a
greedy validation on a fixed valid_seen panel, and one `epoch_NNN/` folder (trainable weights, optimizer
state, skill corpus, metrics) published atomically. A killed run resumes after its last complete epoch and
refuses checkpoints made under different parameters; `rl.epochs` is left out of the run's identity, so more
epochs extend a finished run and fewer stop at the run's own last epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import random
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import fmean

import torch
import yaml
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from seed_core import distributed, launch
from seed_core.config import Params, RLConfig, load_params
from seed_core.envs import GameEntry, environment
from seed_core.method.update import NonFiniteError, Trainer, method_spec
from seed_core.models import ModelError, load_for, lora_config
from seed_core.records import (
    epoch_dir,
    epoch_dirs,
    epoch_of,
    publish_dir,
    split_timing,
    storage_error,
    timing_path,
    write_json,
    write_jsonl,
)
from seed_core.rollout import play, summarize
from seed_core.runtime import derive_seed, seed_everything, setup
from seed_core.tracking import Tracker

# rl.init -> the checkpoint RL starts from (the dvc.yaml outputs of train_analyzer, warmup and prepare).
INIT = {"analyzer": "models/analyzer", "warmup": "models/warmup", "base": "models/base"}


# ---------------------------------------------------------------- epochs: checkpoints, resume, outputs


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


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
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
                changes = "; ".join(_diff(old, fp)) or "the starting model changed"
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


def games_for_update(train: list[GameEntry], cfg: RLConfig, index: int) -> list[GameEntry]:
    """B games for update `index`, a function of (seed, index) only, so a resumed run draws the same ones."""
    rng = random.Random(derive_seed(cfg.seed, index, stride=1_000_003))
    return rng.sample(train, min(cfg.games_per_update, len(train)))


class RLRun:
    """The `rl` stage as epochs: `pending()` lists the epochs left, `run_epoch(e)` trains and checkpoints one,
    `finish()` writes the final model and metrics. A killed run resumes after its last complete epoch, and
    refuses to resume checkpoints made under different parameters.

    With several ranks (`rl.launcher: torchrun`) every rank builds its own RLRun (its shard of the learner, its
    sampler and game pool); only rank 0 logs, tracks and writes, and the launching process calls `write_outputs`."""

    def __init__(self, params: Params, init_dir: Path, manifest_dir: Path, run_dir: Path, log=print):
        cfg = self.cfg = params.rl
        method_spec(cfg.method)
        self.params, self.run_dir, self.init_dir = params, run_dir, init_dir
        self.log = log if distributed.is_main() else (lambda _msg: None)
        env = environment(params)
        self.train = env.read_manifest(manifest_dir / "train.json")
        self.panel = env.read_manifest(manifest_dir / "valid_seen.json")[: cfg.validation_games]
        fixed = yaml.safe_load(Path(cfg.sdar_skills).read_text()) if cfg.method == "sdar" else None

        open_run_dir(params, init_dir, run_dir)

        seed_everything(cfg.seed)
        model, self.tok = load_for(init_dir, params.model, full_finetune=cfg.lora_r is None)
        self.trainer = Trainer(model, self.tok, params, fixed, sampler_dir=init_dir, env=env)
        done = epoch_dirs(run_dir, cfg.epochs)
        if done:
            load_epoch(self.trainer, done[-1])
            self.trainer.sync_sampler()
            self.log(f"resuming after {done[-1].name}")
        self.done = len(done)
        self.pool = env.open_pool(params.env.workers)
        self.tracker = Tracker("rl", dataclasses.asdict(params), enabled=distributed.is_main())

    def pending(self) -> list[int]:
        return list(range(self.done + 1, self.cfg.epochs + 1))

    def run_epoch(self, epoch: int) -> dict:
        cfg, trainer = self.cfg, self.trainer
        updates, corpus = [], []
        for u in range(cfg.updates_per_epoch):
            index = (epoch - 1) * cfg.updates_per_epoch + u
            seed_everything(derive_seed(cfg.seed, index, stride=10_000))
            metrics, skills = trainer.update(self.pool, games_for_update(self.train, cfg, index), index)
            updates.append({"update": index, **metrics})
            corpus += skills
            self.tracker.log(metrics, step=index)
            self.log(
                f"epoch {epoch} update {index}: success {metrics['rollout/success_rate']:.2f} "
                f"skills parsed {metrics.get('skills/parse_rate', 0):.2f} "
                f"OPD active {metrics.get('opd/active_token_ratio', 0):.2f}"
            )
            if self.spec_uses_skills and metrics.get("skills/parse_rate", 0) == 0:
                self.log("no skill parsed in this update: OPD contributed nothing (skills/parse_rate = 0)")
        self.tracker.log_skills(corpus, step=epoch * cfg.updates_per_epoch - 1)
        validation = {}
        if self.panel:
            trainer.model.eval()
            val = play(
                trainer.sampler,
                self.pool,
                self.panel[distributed.rank() :: distributed.world()],
                group_size=1,
                env=self.params.env,
                gen=dataclasses.replace(self.params.rollout, temperature=0.0),
                seed=0,
                tag=f"rl/val/e{epoch}",
                progress=False,
            )
            m = summarize([t for part in distributed.gather(val) for t in part])
            validation = {"val/success_rate": m["success/micro"], "val/invalid_rate": m["invalid_rate"]}
            self.tracker.log(validation, step=epoch * cfg.updates_per_epoch - 1)
        save_epoch(trainer, self.run_dir, epoch, corpus, updates, validation)
        self.done = epoch
        return {"epoch": epoch, **updates[-1], **validation}

    @property
    def spec_uses_skills(self) -> bool:
        return self.trainer.spec.skills != "none"

    def close(self) -> None:
        self.pool.close()
        self.tracker.finish()
        self.trainer.close()

    def finish(self, final_dir: Path, metrics_path: Path, plots_path: Path) -> dict:
        """Close the run, then write the final model and the metrics files from its epoch folders."""
        self.close()
        return write_outputs(self.params, self.init_dir, self.run_dir, final_dir, metrics_path, plots_path)


def write_outputs(
    params: Params, init_dir: Path, run_dir: Path, final_dir: Path, metrics_path: Path, plots_path: Path
) -> dict:
    """The final model (the last epoch's weights, adapters merged into plain weights) and the run's metrics files,
    from the epoch folders alone: the same whether one process or several ranks trained them."""
    cfg = params.rl
    epochs = epoch_dirs(run_dir, cfg.epochs)
    if not epochs:
        raise ModelError(f"{run_dir} holds no complete epoch; run the rl stage (`dvc repro rl`)")
    model, tok = load_for(init_dir, params.model, full_finetune=cfg.lora_r is None)
    if cfg.lora_r is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(model, cfg.lora_r, cfg.lora_alpha, params.vision.trainable))
    weights = load_file(epochs[-1] / "trainable.safetensors")
    missing = [k for k in weights if k not in dict(model.named_parameters())]
    if missing:
        raise ModelError(f"{epochs[-1]} does not match the model ({missing[:3]}); delete {run_dir} and re-run rl")
    model.load_state_dict(weights, strict=False)
    final = model.merge_and_unload() if cfg.lora_r is not None else model

    def write(tmp: Path) -> None:
        final.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    publish_dir(final_dir, write)

    updates, timing, vals = [], [], []
    for ep in epochs:
        m = json.loads((ep / "metrics.json").read_text())
        updates += m["updates"]
        # DVC neither hashes nor caches timing.json (.dvcignore): a `dvc checkout` brings back the results only
        timing += json.loads((ep / "timing.json").read_text()) if (ep / "timing.json").exists() else []
        vals.append({"epoch": epoch_of(ep), **m["validation"]})
    write_json(plots_path, updates)
    write_json(timing_path(plots_path), timing)
    keys = sorted({k for u in updates for k in u if k.startswith(("opd/", "skills/"))})
    summary = {
        "method": cfg.method,
        "advantage": cfg.advantage,
        "updates": len(updates),
        "last_update": {k: v for k, v in updates[-1].items() if k != "update"} if updates else {},
        "mean_over_updates": {k: fmean(u[k] for u in updates if k in u) for k in keys},
        "validation": vals,
    }
    write_json(metrics_path, summary)
    return summary


def train(
    params: Params, params_path: Path, init_dir: Path, manifest_dir: Path, run_dir: Path, log=print
) -> Iterator[tuple[int, Callable[[], dict]]]:
    """The pending epochs as (epoch, train_it): calling train_it() trains the epoch (`launcher: local`), or waits for
    the rank processes to publish it (`torchrun`), and returns its summary. The Prefect flow runs each call as a task
    run; `write_outputs` comes after the last."""
    if params.rl.launcher == "local":
        run = RLRun(params, init_dir, manifest_dir, run_dir, log)
        try:
            for epoch in run.pending():
                yield epoch, functools.partial(run.run_epoch, epoch)
        finally:
            run.close()
        return
    pending = open_run_dir(params, init_dir, run_dir)  # refuses a mismatched folder before any rank starts
    if not pending:
        return
    argv = ["--params", str(params_path), "--init", str(init_dir), "--manifest-dir", str(manifest_dir),
            "--run-dir", str(run_dir)]  # fmt: skip
    if params.rl.launcher == "torchrun":
        command = launch.torchrun_command(params.rl.world_size, argv)
        log(f"starting {params.rl.world_size} ranks: {' '.join(command)}")
        epochs = launch.run_ranks(command, run_dir, pending, log)
    else:
        log(f"starting {params.rl.world_size} ranks with Ray Train on {params.rl.ray_address or 'a local Ray cluster'}")
        epochs = launch.ray_ranks(main, argv, params, run_dir, pending, log)
    for epoch in epochs:
        yield epoch, functools.partial(epoch_summary, run_dir, epoch)


def main(argv: list[str] | None = None) -> None:
    """One rank of `rl.launcher: torchrun`: every pending epoch, in step with the other ranks."""
    ap = argparse.ArgumentParser(
        description=main.__doc__
        + " Start it under torchrun: the rl stage does (see seed_core.launch); for several nodes, run torchrun on each (README)."
    )
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--init", type=Path, help="the checkpoint RL starts from (default: the one rl.init names)")
    ap.add_argument("--manifest-dir", type=Path, default=Path("data/manifests"))
    ap.add_argument("--run-dir", type=Path, help="the run folder (default: runs/rl/<the run folder of these params>)")
    args = ap.parse_args(argv)
    params = load_params(args.params)
    setup(offline=params.model.offline)
    init = args.init or Path(INIT[params.rl.init])
    run_dir = args.run_dir or Path("runs/rl") / run_folder_name(params, init)
    owned = distributed.init()
    try:
        run = RLRun(params, init, args.manifest_dir, run_dir)
        for epoch in run.pending():
            run.run_epoch(epoch)
        run.close()
    finally:
        if owned:
            distributed.close()


if __name__ == "__main__":
    main()
