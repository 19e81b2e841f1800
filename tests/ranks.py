"""Rank program of the distributed tests, run under torchrun (`python -m torch.distributed.run ... tests/ranks.py`).

    ranks.py CASES DATA OUT   CASES: comma-separated, run in order in one launch (a launch costs ~15 s of start-up)
      update:V   one update of variant V (a key of DATA's "variants")
      nan        NaN advantages on the last rank only
      save       one update, saved as DATA's folder/run/epoch_001, then a second update (an uninterrupted run)
      resume     a fresh trainer resumes from DATA's folder/run/epoch_001 and runs the second update
DATA is a pickle of {"variants": {name: raw params dict}, "model": tiny model folder, "trajs": [...], "skills": [...]}
(`nan`, `save` and `resume` use variant "lora"); each rank learns from the trajectories of its own GRPO groups
(groups r, r + world, ...), as `Trainer.update` plays them. Per case, rank 0 writes OUT/CASE/weights.safetensors (the
gathered trainable weights) and OUT/CASE/grads.safetensors (the first optimizer step's gradients), and every rank
OUT/CASE/rank<r>.json.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from seed_core import distributed
from seed_core.config import params_from_dict
from seed_core.method.update import Trainer
from seed_core.models import load_model
from seed_core.stages.rl import load_epoch, save_epoch


def run_case(case: str, d: dict, run_dir: Path, out: Path) -> None:
    rank, world = distributed.rank(), distributed.world()
    groups = list(dict.fromkeys(t.group_id for t in d["trajs"]))
    mine = [i for i, t in enumerate(d["trajs"]) if groups.index(t.group_id) % world == rank]
    trajs, skills = [d["trajs"][i] for i in mine], [d["skills"][i] for i in mine]
    model, tok = load_model(d["model"])
    trainer = Trainer(model, tok, params_from_dict(d["variants"][case.partition(":")[2] or "lora"]))
    report: dict = {"steps": 0}
    grads: dict[str, torch.Tensor] = {}

    def keep_grads(*_) -> None:  # the clipped gradients of the first optimizer step, gathered (a collective)
        if not grads:
            for name, p in trainer.model.named_parameters():
                if p.requires_grad:
                    grads[name] = distributed.full(p.grad).detach().cpu().clone()

    trainer.opt.register_step_pre_hook(keep_grads)
    if case == "nan":
        batch = trainer.build_batch(trajs, skills)
        if rank == world - 1:
            batch = dataclasses.replace(batch, advantage=batch.advantage * float("nan"))
        report["metrics"], _ = trainer.optimize(batch, 0)
        report["steps"] = len(batch.steps)
    else:
        if case == "resume":
            load_epoch(trainer, run_dir / "epoch_001")
        for index in {"save": [0, 1], "resume": [1]}.get(case, [0]):
            report["metrics"], corpus = trainer.learn(trajs, index, skills=skills)
            if case == "save" and index == 0:
                save_epoch(trainer, run_dir, 1, corpus, [report["metrics"]], {})
        report["corpus"] = len(corpus)
        report["steps"] = sum(t.length for t in trajs)
    weights = {k: distributed.full(v).detach().cpu().contiguous() for k, v in trainer.model.named_parameters()
               if v.requires_grad}  # fmt: skip
    if trainer.sampler is not trainer.policy:  # a rank's own HF copy must serve the learner's weights
        served = dict(trainer.sampler.model.named_parameters())
        report["sampler_max_diff"] = max(float((served[k] - v).abs().max()) for k, v in weights.items())
    out.mkdir(parents=True, exist_ok=True)
    if distributed.is_main():
        save_file(weights, out / "weights.safetensors")
        if grads:
            save_file(grads, out / "grads.safetensors")
    (out / f"rank{rank}.json").write_text(json.dumps(report, default=float))


def main(cases: str, data: Path, out: Path) -> None:
    distributed.init(timeout_s=120)
    d = pickle.loads(data.read_bytes())
    for case in cases.split(","):
        run_case(case, d, data.parent / "run", out / case)
    distributed.close()


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
