"""Fault injection, data: a missing game archive, unreadable trajectory and skill-corpus files, corrupt
checkpoints. Each is refused with an error naming the file and what to run; nothing silently uses wrong data
and nothing next to the damaged file is touched."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from faultsuite import intact
from seed_core.config import params_from_dict
from seed_core.envs.alfworld.data import DataError, install, list_games, stratified_subset, write_manifest
from seed_core.models import ModelError, load_model
from seed_core.records import Skill, Step, Trajectory, epoch_dirs, write_jsonl
from seed_core.stages.rl import RLRun, save_epoch
from seed_core.stages.train_analyzer import heldout_set
from seed_core.tools import cli

# ---------------------------------------------------------------- the game archive


@pytest.mark.fault("data")
def test_missing_archive_is_refused_by_the_cli_and_leaves_nothing(tmp_path, capsys):
    with pytest.raises(DataError, match=r"archive .*nope.tgz does not exist; .*seed data alfworld --archive"):
        install(tmp_path / "alf", tmp_path / "nope.tgz")
    with pytest.raises(SystemExit) as e:
        cli.main(["data", "alfworld", "--archive", str(tmp_path / "nope.tgz"), "--data-dir", str(tmp_path / "alf")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: archive {tmp_path / 'nope.tgz'} does not exist") and "--archive" in err
    assert list(tmp_path.iterdir()) == []  # no data folder, no staging folder


# ---------------------------------------------------------------- trajectory and skill files


def _traj(i: int) -> Trajectory:
    step = Step(
        observation="You are in a room.",
        admissible_actions=["look"],
        prompt="p",
        response="<think>t</think><action>look</action>",
        response_ids=[1, 2],
        response_logprobs=[-0.5, -0.25],
        action="look",
        valid=True,
        reward=0.0,
        feedback="Nothing happens.",
    )
    return Trajectory(
        f"t{i}",
        f"valid_seen/look_at_obj_in_light-x-{i}/trial",
        "valid_seen",
        "look_at_obj_in_light",
        "look at x.",
        f"g{i}",
        0,
        False,
        0.0,
        1,
        0,
        [step],
    )


def _skill(i: int) -> Skill:
    return Skill(
        f"t{i}",
        f"valid_seen/look_at_obj_in_light-x-{i}/trial",
        "look_at_obj_in_light",
        "failure",
        "s",
        "Find the lamp first.",
        "ok",
        "{}",
        "oracle",
        "h",
    )


CORRUPTIONS = {
    # name: (bytes appended to a good file, or a function of its bytes; the error detail expected)
    "cut-mid-line": (lambda b: b[: len(b) - 40], "JSONDecodeError"),
    "binary-garbage": (lambda b: b + b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe\xfd\n", "UnicodeDecodeError"),
    "not-an-object": (lambda b: b + b'"just a string"\n', "a JSON str, not an object"),
    "wrong-fields": (lambda b: b + json.dumps({"traj_id": "t9", "colour": "red"}).encode() + b"\n", "TypeError"),
}


@pytest.mark.fault("data")
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_trajectory_file_is_refused_naming_file_and_line(tmp_path, corruption):
    damage, detail = CORRUPTIONS[corruption]
    sft = tmp_path / "sft"
    write_jsonl(sft / "validation_trajectories.jsonl", [_traj(0), _traj(1)])
    write_jsonl(sft / "skills.jsonl", [_skill(0), _skill(1)])
    assert [t.traj_id for t in heldout_set(sft)[0]] == ["t0", "t1"]  # the good file reads back

    path = sft / "validation_trajectories.jsonl"
    path.write_bytes(damage(path.read_bytes()))
    line = 2 if corruption == "cut-mid-line" else 3
    with intact(sft), pytest.raises(ValueError) as e:
        heldout_set(sft)  # what train_analyzer reads
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line} is not a valid Trajectory record (") and detail in msg, msg
    assert "delete the file and re-run the stage that writes it (`dvc repro`)" in msg


@pytest.mark.fault("data")
@pytest.mark.parametrize("corruption", ["cut-mid-line", "binary-garbage", "not-an-object"])
def test_corrupt_skill_corpus_is_refused_by_seed_skills(tmp_path, monkeypatch, capsys, corruption):
    damage, _ = CORRUPTIONS[corruption]
    epoch = tmp_path / "runs/rl/seed-grpo-s0-abc/epoch_001"
    write_jsonl(epoch / "skills.jsonl", [{**json.loads(json.dumps(_skill(i).__dict__)), "update": 0} for i in range(2)])
    monkeypatch.chdir(tmp_path)
    cli.main(["skills", "--json"])
    assert len(json.loads(capsys.readouterr().out)) == 2

    path = epoch / "skills.jsonl"
    path.write_bytes(damage(path.read_bytes()))
    with intact(epoch), pytest.raises(SystemExit) as e:
        cli.main(["skills"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == ""  # no partial listing
    line = 2 if corruption == "cut-mid-line" else 3
    assert out.err.startswith(f"error: runs/rl/seed-grpo-s0-abc/epoch_001/skills.jsonl:{line} is not valid JSON (")
    assert "delete its epoch folder and re-run the rl stage (`dvc repro rl`)" in out.err


# ---------------------------------------------------------------- checkpoints

SMALL = {
    "env": {"max_steps": 2, "workers": 0},
    "rollout": {"max_new_tokens": 5, "batch_size": 8},
    "rl": {
        "method": "grpo",
        "epochs": 3,
        "updates_per_epoch": 1,
        "games_per_update": 1,
        "group_size": 2,
        "validation_games": 1,
        "learning_rate": 0.01,
    },
}


@pytest.fixture
def manifests(alfworld_root, tmp_path):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 1, seed=0)
    for name in ("train", "valid_seen"):
        write_manifest(tmp_path / "manifests" / f"{name}.json", alfworld_root, games)
    return tmp_path / "manifests"


@pytest.mark.fault("data", n=2)
def test_corrupt_rl_checkpoint_is_refused_with_what_to_run(tiny_model_dir, manifests, tmp_path):
    p = params_from_dict(SMALL)
    run_dir = tmp_path / "run"
    run = RLRun(p, tiny_model_dir, manifests, run_dir)
    run.pool.close()
    for epoch in (1, 2):  # two checkpoints written by the stage's own writer
        with torch.no_grad():
            next(w for w in run.trainer.model.parameters() if w.requires_grad).add_(0.5)
        save_epoch(run.trainer, run_dir, epoch, [], [{"update": epoch - 1}], {})
    assert [e.name for e in epoch_dirs(run_dir)] == ["epoch_001", "epoch_002"]
    good = load_file(run_dir / "epoch_001" / "trainable.safetensors")

    # 1. the newest checkpoint's weights are cut short (a copy interrupted, a bad disk)
    weights = run_dir / "epoch_002" / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    with intact(run_dir), pytest.raises(ModelError) as e:
        RLRun(p, tiny_model_dir, manifests, run_dir)
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {run_dir / 'epoch_002'} is unreadable (SafetensorError: ")
    assert f"delete {run_dir / 'epoch_002'} and re-run the rl stage (`dvc repro rl`): it resumes after epoch_001" in msg

    # Doing what the message says resumes from the previous good epoch, with its exact weights.
    shutil.rmtree(run_dir / "epoch_002")
    resumed = RLRun(p, tiny_model_dir, manifests, run_dir)
    resumed.pool.close()
    assert resumed.pending() == [2, 3]
    now = dict(resumed.trainer.model.named_parameters())
    assert all(torch.equal(now[k], v) for k, v in good.items())

    # 2. the only checkpoint's state file is garbage
    shutil.rmtree(run_dir / "epoch_001")
    save_epoch(resumed.trainer, run_dir, 1, [], [], {})
    (run_dir / "epoch_001" / "state.json").write_bytes(b"\x00\x00\x00 not json")
    with intact(run_dir), pytest.raises(ModelError) as e:
        RLRun(p, tiny_model_dir, manifests, run_dir)
    assert f"checkpoint {run_dir / 'epoch_001'} is unreadable (JSONDecodeError: " in str(e.value)
    assert "it starts again from the initial model" in str(e.value)


@pytest.mark.fault("data")
def test_truncated_model_weights_are_refused(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "analyzer"
    shutil.copytree(tiny_model_dir, model_dir)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with intact(model_dir), pytest.raises(ModelError) as e:
        load_model(model_dir)
    msg = str(e.value)
    assert msg.startswith(f"model {model_dir} is unreadable (SafetensorError: ")
    assert "delete the folder and re-run the stage that writes it (`dvc repro`)" in msg
