"""The stage's outputs from the epoch folders alone: the final model and the metrics files."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

from safetensors.torch import load_file

from seed_core.config import Params
from seed_core.models import ModelError, load_for, with_lora
from seed_core.records import epoch_dirs, epoch_of, publish_dir, timing_path, write_json


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
        model = with_lora(model, cfg.lora_r, cfg.lora_alpha, params.vision.trainable)
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
