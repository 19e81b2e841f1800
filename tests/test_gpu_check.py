"""bench/gpu_check.py is run only on a lent GPU: its CPU path (`--tiny`) keeps it from rotting in between."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a benchmark

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_tiny_runs_the_update_and_shows_why_full_finetuning_keeps_fp32():
    proc = subprocess.run([sys.executable, str(REPO / "bench/gpu_check.py"), "--tiny"], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "gpu_check" and out["all_on_device"] and out["steps"] == 8
    full, bf16, lora = out["full_ft"], out["full_ft_bf16_weights"], out["lora"]
    assert full["skipped_steps"] == bf16["skipped_steps"] == lora["skipped_steps"] == 0.0
    # lr 1e-6: fp32 master weights take every step; on bf16 weights most of them round away
    assert full["weights_changed_fraction"] > 0.9 > 0.5 > bf16["weights_changed_fraction"]
    # LoRA: B starts at 0, so only B moves in the first step (A's gradient is B^T-weighted: zero)
    assert lora["weights_changed_fraction"] == 0.5
    # the scale-out path: one FSDP2 rank (gloo here, NCCL on the GPU) takes the same step as the unwrapped update
    fsdp = out["fsdp2_full_ft"]
    assert fsdp["backend"] == "gloo" and fsdp["skipped_steps"] == 0.0
    assert fsdp["weights_changed_fraction"] == full["weights_changed_fraction"]
    assert fsdp["max_abs_diff_vs_unwrapped"] < 1e-7  # a tenth of the lr-1e-6 step
    assert fsdp["checkpoint_round_trip_equal"] and fsdp["checkpoint_optimizer_states"] > 0
