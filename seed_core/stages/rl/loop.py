"""The epoch loop: `RLRun` trains, validates and checkpoints one epoch at a time; `train` yields the pending epochs
to the flow, run here or by rank processes (`launch`)."""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from seed_core import distributed, launch
from seed_core.config import Params, RLConfig
from seed_core.envs import GameEntry, environment
from seed_core.method.update import Trainer, method_spec
from seed_core.models import load_for
from seed_core.records import epoch_dirs
from seed_core.rollout import play, summarize
from seed_core.runtime import derive_seed, seed_everything
from seed_core.stages.rl.checkpoints import epoch_summary, load_epoch, save_epoch
from seed_core.stages.rl.export import write_outputs
from seed_core.stages.rl.identity import open_run_dir
from seed_core.tracking import Tracker


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
        self.params, self.run_dir, self.init_dir = params, run_dir, init_dir
        self.log = log if distributed.is_main() else (lambda _msg: None)
        env = environment(params)
        self.train = env.read_manifest(manifest_dir / "train.json")
        self.panel = env.read_manifest(manifest_dir / "valid_seen.json")[: cfg.validation_games]
        fixed = None
        if method_spec(cfg.method).skills == "fixed":
            path = cfg.sdar_skills or env.sdar_skills
            if path is None:
                raise ValueError(f"rl.method sdar needs fixed skills: set rl.sdar_skills ({env.name} names none)")
            fixed = yaml.safe_load(Path(path).read_text())

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
        from seed_core.stages.rl.ranks import main  # the rank program imports this module

        epochs = launch.ray_ranks(main, argv, params, run_dir, pending, log)
    for epoch in epochs:
        yield epoch, functools.partial(epoch_summary, run_dir, epoch)
