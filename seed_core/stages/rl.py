"""The `rl` stage: Stage 2 (`seed_core.method.update.Trainer`) for rl.epochs checkpointed, resumable epochs.

Each parameter set trains in its own run folder (`<method>-<advantage>-s<seed>-<hash>`, the hash of the
parameters that shape the run and of the starting weights). An epoch is `rl.updates_per_epoch` updates, a
greedy validation on a fixed valid_seen panel, and one `epoch_NNN/` folder (trainable weights, optimizer
state, skill corpus, metrics) published atomically. A killed run resumes after its last complete epoch and
refuses checkpoints made under different parameters; `rl.epochs` is left out of the run's identity, so more
epochs extend a finished run and fewer stop at the run's own last epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path
from statistics import fmean

import torch
import yaml
from safetensors.torch import load_file, save_file

from seed_core.config import Params, RLConfig
from seed_core.envs import GameEntry, environment
from seed_core.method.update import NonFiniteError, Trainer, method_spec
from seed_core.models import ModelError, load_for
from seed_core.records import epoch_dir, epoch_dirs, epoch_of, publish_dir, storage_error, write_json, write_jsonl
from seed_core.rollout import play, summarize
from seed_core.runtime import seed_everything
from seed_core.tracking import Tracker

# rl.init -> the checkpoint RL starts from (the dvc.yaml outputs of train_analyzer, warmup and prepare).
INIT = {"analyzer": "models/analyzer", "warmup": "models/warmup", "base": "models/base"}


# ---------------------------------------------------------------- epochs: checkpoints, resume, outputs


def fingerprint(params: Params, init_dir: Path) -> dict:
    """What a resumed run must share with the run that wrote the checkpoints."""
    relevant = {k: dataclasses.asdict(getattr(params, k)) for k in ("model", "env", "rollout", "rl")}
    relevant["rl"].pop("epochs")  # more epochs may be added to a finished run
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


def save_epoch(
    trainer: Trainer, run_dir: Path, epoch: int, corpus: list[dict], updates: list[dict], validation: dict
) -> Path:
    """Publish one epoch's checkpoint, skill corpus and metrics as `epoch_NNN/` (`records.publish_dir`).

    A failure (non-finite weights, disk full, read-only folder) leaves no temp folder and every earlier epoch
    as it was."""
    final = epoch_dir(run_dir, epoch)
    weights = {k: v.detach().cpu().contiguous() for k, v in trainer.model.named_parameters() if v.requires_grad}
    if not all(torch.isfinite(v).all() for v in weights.values()):
        raise NonFiniteError("refusing to checkpoint non-finite weights")
    opt_state, opt_meta = {}, {}
    for i, st in trainer.opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0:
                opt_state[f"{i}.{k}"] = v.contiguous()
            else:
                opt_meta[f"{i}.{k}"] = float(v)

    def write(tmp: Path) -> None:
        for name, tensors in (("trainable.safetensors", weights), ("optimizer.safetensors", opt_state)):
            try:
                save_file(tensors, tmp / name)
            except Exception as e:  # SafetensorError carries the OS error only in its text
                if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
                    raise
                raise storage_error(final / name, e) from e
        write_jsonl(tmp / "skills.jsonl", corpus)
        write_json(tmp / "metrics.json", {"updates": updates, "validation": validation})
        state = {"epoch": epoch, "optimizer_scalars": opt_meta, "nonfinite_in_row": trainer.nonfinite_in_row}
        write_json(tmp / "state.json", state)

    return publish_dir(final, write)


def load_epoch(trainer: Trainer, epoch_dir: Path) -> None:
    """Restore weights, optimizer state and counters from an epoch folder; an unreadable or incomplete one is a
    ModelError saying to delete it, so a run never resumes from wrong weights."""
    try:
        weights = load_file(epoch_dir / "trainable.safetensors")
        params = dict(trainer.model.named_parameters())
        missing = sorted({k for k, p in params.items() if p.requires_grad} - set(weights))
        unexpected = sorted(set(weights) - set(params))
        if missing or unexpected:
            raise KeyError(f"its tensors do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
        state = json.loads((epoch_dir / "state.json").read_text())
        tensors = load_file(epoch_dir / "optimizer.safetensors")
        sd = trainer.opt.state_dict()
        new_state: dict[int, dict] = {}
        for key, v in tensors.items():
            i, k = key.split(".", 1)
            new_state.setdefault(int(i), {})[k] = v
        for key, v in state["optimizer_scalars"].items():
            i, k = key.split(".", 1)
            new_state.setdefault(int(i), {})[k] = torch.tensor(v)
        nonfinite = int(state["nonfinite_in_row"])
    except Exception as e:  # SafetensorError, OSError, JSONDecodeError, KeyError, ...
        n = epoch_of(epoch_dir) or 0
        resume = f"resumes after epoch_{n - 1:03d}" if n > 1 else "starts again from the initial model"
        raise ModelError(
            f"checkpoint {epoch_dir} is unreadable ({type(e).__name__}: {e}); delete {epoch_dir} and re-run the rl "
            f"stage (`dvc repro rl`): it {resume} and trains that epoch again"
        ) from e
    with torch.no_grad():
        for k, v in weights.items():
            params[k].copy_(v)
    sd["state"] = new_state
    trainer.opt.load_state_dict(sd)
    trainer.nonfinite_in_row = nonfinite


def games_for_update(train: list[GameEntry], cfg: RLConfig, index: int) -> list[GameEntry]:
    """B games for update `index`, a function of (seed, index) only, so a resumed run draws the same ones."""
    rng = random.Random(cfg.seed * 1_000_003 + index)
    return rng.sample(train, min(cfg.games_per_update, len(train)))


class RLRun:
    """The `rl` stage as epochs: `pending()` lists the epochs left, `run_epoch(e)` trains and checkpoints one,
    `finish()` writes the final model and metrics. A killed run resumes after its last complete epoch, and
    refuses to resume checkpoints made under different parameters."""

    def __init__(self, params: Params, init_dir: Path, manifest_dir: Path, run_dir: Path, log=print):
        cfg = self.cfg = params.rl
        method_spec(cfg.method)
        self.params, self.run_dir, self.log = params, run_dir, log
        env = environment(params)
        self.train = env.read_manifest(manifest_dir / "train.json")
        self.panel = env.read_manifest(manifest_dir / "valid_seen.json")[: cfg.validation_games]
        fixed = yaml.safe_load(Path(cfg.sdar_skills).read_text()) if cfg.method == "sdar" else None

        run_dir.mkdir(parents=True, exist_ok=True)
        fp, fp_path = fingerprint(params, init_dir), run_dir / "run.json"
        if fp_path.exists():
            old = json.loads(fp_path.read_text())
            if old != fp:
                changes = "; ".join(_diff(old, fp)) or "the starting model changed"
                raise ValueError(
                    f"{run_dir} holds epochs of a run made under different parameters ({changes}); "
                    f"delete {run_dir} to start over, or restore the parameters to resume"
                )
        else:
            write_json(fp_path, fp)

        seed_everything(cfg.seed)
        model, self.tok = load_for(init_dir, params.model, full_finetune=cfg.lora_r is None)
        self.trainer = Trainer(model, self.tok, params, fixed, sampler_dir=init_dir)
        done = epoch_dirs(run_dir, cfg.epochs)
        if done:
            load_epoch(self.trainer, done[-1])
            self.trainer.sync_sampler()
            log(f"resuming after {done[-1].name}")
        self.done = len(done)
        self.pool = env.open_pool(params.env.workers)
        self.tracker = Tracker("rl", dataclasses.asdict(params))

    def pending(self) -> list[int]:
        return list(range(self.done + 1, self.cfg.epochs + 1))

    def run_epoch(self, epoch: int) -> dict:
        cfg, trainer = self.cfg, self.trainer
        updates, corpus = [], []
        for u in range(cfg.updates_per_epoch):
            index = (epoch - 1) * cfg.updates_per_epoch + u
            seed_everything(cfg.seed * 10_000 + index)
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
                self.panel,
                group_size=1,
                env=self.params.env,
                gen=dataclasses.replace(self.params.rollout, temperature=0.0),
                seed=0,
                tag=f"rl/val/e{epoch}",
                progress=False,
            )
            m = summarize(val)
            validation = {"val/success_rate": m["success/micro"], "val/invalid_rate": m["invalid_rate"]}
            self.tracker.log(validation, step=epoch * cfg.updates_per_epoch - 1)
        save_epoch(trainer, self.run_dir, epoch, corpus, updates, validation)
        self.done = epoch
        return {"epoch": epoch, **updates[-1], **validation}

    @property
    def spec_uses_skills(self) -> bool:
        return self.trainer.spec.skills != "none"

    def finish(self, final_dir: Path, metrics_path: Path, plots_path: Path) -> dict:
        """The final model (adapters merged into plain weights) and the run's metrics files."""
        self.pool.close()
        self.tracker.finish()
        self.trainer.close()
        model = self.trainer.model
        final = model.merge_and_unload() if self.cfg.lora_r is not None else model

        def write(tmp: Path) -> None:
            final.save_pretrained(tmp, safe_serialization=True)
            self.tok.save_pretrained(tmp)

        publish_dir(final_dir, write)

        updates, vals = [], []
        for ep in epoch_dirs(self.run_dir, self.cfg.epochs):
            m = json.loads((ep / "metrics.json").read_text())
            updates += m["updates"]
            vals.append({"epoch": epoch_of(ep), **m["validation"]})
        write_json(plots_path, updates)
        keys = sorted({k for u in updates for k in u if k.startswith(("opd/", "skills/"))})
        summary = {
            "method": self.cfg.method,
            "advantage": self.cfg.advantage,
            "updates": len(updates),
            "last_update": {k: v for k, v in updates[-1].items() if k != "update"} if updates else {},
            "mean_over_updates": {k: fmean(u[k] for u in updates if k in u) for k in keys},
            "validation": vals,
        }
        write_json(metrics_path, summary)
        return summary


def run_rl(
    params: Params,
    init_dir: Path,
    manifest_dir: Path,
    run_dir: Path,
    final_dir: Path,
    metrics_path: Path,
    plots_path: Path,
    log=print,
) -> dict:
    """Every pending epoch, then the final outputs (the Prefect flow does the same with one task per epoch)."""
    run = RLRun(params, init_dir, manifest_dir, run_dir, log)
    for epoch in run.pending():
        run.run_epoch(epoch)
    return run.finish(final_dir, metrics_path, plots_path)
