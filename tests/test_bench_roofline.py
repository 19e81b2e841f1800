"""bench/roofline.py on a tiny model: one JSON line whose figures are consistent with each other."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a benchmark

REPO = Path(__file__).resolve().parents[1]


def test_roofline_prints_ceilings_and_every_pass_before_and_now(tiny_model_dir):
    out = subprocess.run(
        [sys.executable, str(REPO / "bench/roofline.py"), "--model", str(tiny_model_dir), "--tokens", "48",
         "--answer", "8", "--batch", "2", "--new-tokens", "3", "--repeats", "1"],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["bench"] == "roofline" and r["auto_dtype"] in r["ceiling_gflops"]
    c = r["ceiling_gflops"]
    if "bf16" in c:  # of the unrounded ceilings: to the printed ones' rounding (0.1 GFLOP/s) and its own (0.01)
        assert r["bf16_over_fp32"] == pytest.approx(c["bf16"]["train"] / c["fp32"]["train"], rel=0.02, abs=0.01)
    else:
        assert r["bf16_over_fp32"] is None
    assert set(r["passes"]) == {"sft_step", "score", "update", "generate"}
    assert {"before", "no_checkpointing", "answer_only_head", "now"} <= set(r["passes"]["sft_step"])
    for p in r["passes"].values():
        assert all(row["tokens_per_s"] > 0 and row["fraction"] > 0 for name, row in p.items() if name != "speedup")
        assert p["speedup"] == round(p["now"]["tokens_per_s"] / p["before"]["tokens_per_s"], 2)
