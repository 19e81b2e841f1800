"""SPMD ranks on FSDP2, run for real with torchrun (gloo on 127.0.0.1): a 2-rank update equals a 1-rank update on the
same global batch, also with uneven micro-batch counts; a NaN on one rank is skipped by every rank; a checkpoint saved
on 2 ranks resumes on 1 and on 2; a rank killed with SIGKILL stops the run, is named, and a re-run resumes to the
same final weights. Every run is bounded by a timeout, so a hang fails instead of stalling the suite."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seed_core.config import params_from_dict
from seed_core.envs.alfworld.data import list_games, stratified_subset, write_manifest
from seed_core.envs.alfworld.env import EnvPool
from seed_core.launch import RankError
from seed_core.method.update import Trainer
from seed_core.models import load_model
from seed_core.records import Skill, epoch_dir
from seed_core.rollout import play
from seed_core.stages.rl import run_folder_name, train, write_outputs

pytestmark = pytest.mark.e2e  # torchrun ranks

REPO = Path(__file__).resolve().parent.parent
RAW = {
    "env": {"max_steps": 2, "workers": 0},
    "rollout": {"max_new_tokens": 5, "batch_size": 8},
    "rl": {
        "method": "seed",
        "games_per_update": 3,
        "group_size": 2,
        "analyzer_max_new_tokens": 8,
        "learning_rate": 0.01,
        "mini_batch_steps": 64,
        "micro_batch_tokens": 1,  # one step per micro-batch: a rank with more steps runs more micro-batches
    },
}


def raw(**rl) -> dict:
    out = json.loads(json.dumps(RAW))
    out["rl"].update(rl)
    return out


@pytest.fixture(scope="module")
def trajs(alfworld_root, tiny_model_dir):
    """3 real games x 2 episodes of the tiny model (3 GRPO groups: 2 on rank 0, 1 on rank 1), one relabelled won."""
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 3, seed=0)
    entries = write_manifest(Path(str(tiny_model_dir) + "-m") / "m.json", alfworld_root, games)
    p = params_from_dict(raw())
    model, tok = load_model(tiny_model_dir)
    with EnvPool(alfworld_root, 0) as pool:
        out = play(
            Trainer(model, tok, p).policy, pool, entries, group_size=2, env=p.env, gen=p.rollout, seed=0, tag="t",
            progress=False,
        )  # fmt: skip
    out[0] = dataclasses.replace(out[0], won=True, episode_return=10.0)
    return out


def torchrun(n: int, cases: list[str], data: Path, out: Path, timeout: float = 600) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "--max-restarts=0",
        str(REPO / "tests" / "ranks.py"), ",".join(cases), str(data), str(out),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.fixture(scope="module")
def ranks(trajs, tiny_model_dir, tmp_path_factory):
    """Every case of tests/ranks.py from two launches, 2 ranks then 1 (a launch costs ~15 s of start-up): {n: out}.
    The 2-rank launch saves epoch_001 and resumes it; the 1-rank launch resumes the same folder."""
    root = tmp_path_factory.mktemp("ranks")
    skills = [
        Skill(t.traj_id, t.game_id, t.task_type, "failure", "s", "look first, then take the object" if i % 3 else "",
              "ok" if i % 3 else "failed", "", "test", "h")
        for i, t in enumerate(trajs)
    ]  # fmt: skip
    variants = {"lora": raw(lora_r=16), "full": raw(lora_r=None)}
    data = root / "data.pkl"
    data.write_bytes(pickle.dumps({"variants": variants, "model": tiny_model_dir, "trajs": trajs, "skills": skills}))
    torchrun(2, ["update:lora", "update:full", "nan", "save", "resume"], data, root / "two")
    torchrun(1, ["update:lora", "update:full", "resume"], data, root / "one")
    return {2: root / "two", 1: root / "one"}


def results(out: Path) -> tuple[list[dict], dict]:
    """(every rank's report, the gathered trainable weights) of one case's folder."""
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return reports, load_file(out / "weights.safetensors")


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def initial_weights(tiny_model_dir, **rl) -> dict:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, tok, params_from_dict(raw(**rl)))
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}


@pytest.mark.parametrize("lora_r", [16, None], ids=["lora", "full"])
def test_two_rank_update_equals_one_rank_with_uneven_micro_batches(ranks, trajs, tiny_model_dir, lora_r):
    case = f"update:{'lora' if lora_r else 'full'}"
    (one,), w1 = results(ranks[1] / case)
    two, w2 = results(ranks[2] / case)
    assert two[0]["steps"] != two[1]["steps"]  # uneven: one micro-batch per step, so uneven micro-batch counts
    assert two[0]["steps"] + two[1]["steps"] == one["steps"]
    g1, g2 = (load_file(ranks[n] / case / "grads.safetensors") for n in (1, 2))
    grad_scale = max(float(g.abs().max()) for g in g1.values())
    grad_diff = max_diff(g1, g2)
    moved = max_diff(w1, initial_weights(tiny_model_dir, lora_r=lora_r))
    diff = max_diff(w1, w2)
    print(
        f"2-rank vs 1-rank ({case}): gradients max |dg| {grad_diff:.2e} (max |g| "
        f"{grad_scale:.2e}); weights after the AdamW step max |dw| {diff:.2e} (the step moved them {moved:.2e})"
    )
    assert grad_scale > 0 and grad_diff <= 1e-5 * grad_scale
    # AdamW's first step is lr * g / (|g| + eps): a gradient entry near eps amplifies float-order noise, so the
    # weights agree to a small fraction of the step rather than to the gradients' precision
    assert moved > 1e-3 and diff < 1e-2 * moved
    for key in ("loss/pg", "loss/opd", "loss/kl", "opd/gate_mean", "train/grad_norm"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-7), key
    assert two[0]["corpus"] == two[1]["corpus"] == one["corpus"] == len(trajs)  # every rank holds the whole corpus
    assert [r["sampler_max_diff"] for r in (one, *two)] == [0.0, 0.0, 0.0]  # each rank's sampler was synced


@pytest.mark.fault("numeric")
def test_nan_on_one_rank_is_skipped_by_every_rank(ranks, tiny_model_dir):
    reports, w = results(ranks[2] / "nan")
    assert [r["metrics"]["train/skipped_steps"] for r in reports] == [1.0, 1.0]
    assert max_diff(w, initial_weights(tiny_model_dir)) == 0.0


def test_checkpoint_saved_on_two_ranks_resumes_on_one_and_two(ranks):
    assert {p.name for p in (ranks[2].parent / "run" / "epoch_001").iterdir()} >= {
        "trainable.safetensors",
        "state.json",
    }
    _, uninterrupted = results(ranks[2] / "save")
    _, on_two = results(ranks[2] / "resume")
    _, on_one = results(ranks[1] / "resume")
    assert max_diff(on_two, uninterrupted) == 0.0  # same rank count: bit-identical to never stopping
    lr = RAW["rl"]["learning_rate"]
    assert max_diff(on_one, on_two) < 1e-2 * lr  # another rank count: float order differs, AdamW amplifies it


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes (children of its agent), from their environment."""
    out = {}
    for child in Path("/proc").glob("[0-9]*"):
        try:
            if int((child / "stat").read_text().rsplit(")", 1)[1].split()[1]) != launcher_pid:
                continue
            env = dict(kv.split("=", 1) for kv in (child / "environ").read_text().split("\0") if "=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = int(child.name)
    return out


@pytest.mark.fault("kill")
def test_killed_rank_stops_the_run_and_a_rerun_resumes_to_the_same_weights(alfworld_root, tiny_model_dir, tmp_path):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 2, seed=0)
    mdir = tmp_path / "manifests"
    for name in ("train", "valid_seen"):
        write_manifest(mdir / f"{name}.json", alfworld_root, games)
    r = raw(launcher="torchrun", world_size=2, games_per_update=2, epochs=2, updates_per_epoch=1, validation_games=2)
    r["rl"].pop("micro_batch_tokens")
    (tmp_path / "params.yaml").write_text(json.dumps(r))
    p = params_from_dict(r)

    def run(runs: Path, kill_after: int | None = None) -> list[int]:  # noqa: B023
        run_dir = runs / run_folder_name(p, tiny_model_dir)
        done = []
        for epoch, train_it in train(p, tmp_path / "params.yaml", tiny_model_dir, mdir, run_dir, log=lambda m: None):
            train_it()
            done.append(epoch)
            if epoch == kill_after:
                torchrun_pid = next(int(c.name) for c in Path("/proc").glob("[0-9]*") if _is_torchrun(c, run_dir))
                victim = rank_pids(torchrun_pid)[1]
                os.kill(victim, signal.SIGKILL)
                killed_at.append(time.monotonic())
        write_outputs(p, tiny_model_dir, run_dir, runs / "final", runs / "rl.json", runs / "updates.json")
        return done

    assert run(tmp_path / "a") == [1, 2]
    killed_at: list[float] = []
    with pytest.raises(RankError, match=r"rank 1 died \(killed by SIGKILL\).*Re-run the stage"):
        run(tmp_path / "b", kill_after=1)
    print(f"killed rank 1: the launcher raised {time.monotonic() - killed_at[0]:.1f} s later")
    assert not epoch_dir(tmp_path / "b" / run_folder_name(p, tiny_model_dir), 2).exists()
    assert run(tmp_path / "b") == [2]  # resumes after epoch 1
    a, b = (load_file(tmp_path / x / "final" / "model.safetensors") for x in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def _is_torchrun(proc: Path, run_dir: Path) -> bool:
    try:
        cmd = (proc / "cmdline").read_text().split("\0")
    except OSError:
        return False
    return "torch.distributed.run" in cmd and str(run_dir) in cmd
