"""Fault injection, numeric: an RL run whose update diverges to NaN/inf after a good epoch. The non-finite
steps are skipped and counted, the run stops after `rl.max_nonfinite_in_row` of them, the last good checkpoint
is untouched, nothing is checkpointed from the NaN state, and a restart resumes from the good epoch."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from faultsuite import intact
from seed_core.config import params_from_dict
from seed_core.envs.alfworld.data import list_games, stratified_subset, write_manifest
from seed_core.method.update import NonFiniteError
from seed_core.records import epoch_dirs
from seed_core.stages.rl import RLRun, save_epoch

PARAMS = {
    "env": {"max_steps": 3, "workers": 0},
    "rollout": {"max_new_tokens": 5, "batch_size": 8},
    # One agent turn per mini-batch: an update is three optimizer steps, so a divergence shows up mid-update.
    # (One episode per update, no validation panel, full fine-tuning without a KL reference: kept fast.)
    "rl": {
        "method": "grpo",
        "epochs": 3,
        "updates_per_epoch": 1,
        "games_per_update": 1,
        "group_size": 1,
        "validation_games": 0,
        "learning_rate": 0.01,
        "mini_batch_steps": 1,
        "max_nonfinite_in_row": 2,
        "lora_r": None,
        "kl_coef": 0.0,
    },
}


@pytest.mark.fault("numeric")
def test_divergence_stops_the_run_with_the_last_good_checkpoint_intact(alfworld_root, tiny_model_dir, tmp_path):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 1, seed=0)
    for name in ("train", "valid_seen"):
        write_manifest(tmp_path / "manifests" / f"{name}.json", alfworld_root, games)
    p = params_from_dict(PARAMS)
    run_dir = tmp_path / "run"
    run = RLRun(p, tiny_model_dir, tmp_path / "manifests", run_dir, log=lambda m: None)
    try:
        assert run.run_epoch(1)["train/skipped_steps"] == 0.0
        good = load_file(run_dir / "epoch_001" / "trainable.safetensors")
        assert all(torch.isfinite(v).all() for v in good.values())

        # The fault: epoch 2's optimizer steps blow up (an infinite step size). The first step is computed from
        # finite weights and applied, leaving inf/NaN weights; every later step's loss is then NaN.
        for group in run.trainer.opt.param_groups:
            group["lr"] = math.inf
        with intact(run_dir):
            with pytest.raises(NonFiniteError) as e:
                run.run_epoch(2)
        assert "2 optimizer steps in a row had a non-finite loss or gradient (update 1)" in str(e.value)
        assert "stopping with the last good checkpoint intact" in str(e.value) and "rl.learning_rate" in str(e.value)
        assert run.trainer.nonfinite_in_row == 2
        assert not all(torch.isfinite(w).all() for w in run.trainer.trainable)  # the state really is poisoned

        # Nothing from the NaN state reaches the disk, even when a checkpoint is asked for explicitly.
        with intact(run_dir), pytest.raises(NonFiniteError, match="refusing to checkpoint non-finite weights"):
            save_epoch(run.trainer, run_dir, 2, [], [], {})
        assert sorted(p.name for p in run_dir.iterdir()) == ["epoch_001", "run.json"]  # no epoch_002, no temp folder
        assert [e.name for e in epoch_dirs(run_dir)] == ["epoch_001"]
    finally:
        run.pool.close()

    # A restart resumes after the good epoch, from exactly its weights.
    resumed = RLRun(p, tiny_model_dir, tmp_path / "manifests", run_dir, log=lambda m: None)
    resumed.pool.close()
    assert resumed.pending() == [2, 3] and resumed.trainer.nonfinite_in_row == 0
    now = dict(resumed.trainer.model.named_parameters())
    assert good.keys() <= now.keys() and all(torch.equal(now[k], v) for k, v in good.items())
