"""Fault injection, params: a bad params.yaml given to a real stage command (`python flows/<stage>.py`) in a
project folder that already holds outputs of an earlier run. The stage must exit 2 before any work (no
Prefect server, no flow run, no file created or changed) with a message naming the key and what is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from faultsuite import intact

REPO = Path(__file__).resolve().parents[2]

CASES = {
    # name: (stage, params.yaml content, what the message must say)
    "unknown-key": (
        "rl",
        {"rl": {"learning_rte": 1e-4}},
        ["unknown key `rl.learning_rte`", "allowed keys here:", "'learning_rate'"],
    ),
    "wrong-type": ("rl", {"env": {"max_steps": "thirty"}}, ["`env.max_steps` must be an integer, got 'thirty'"]),
    "out-of-range": ("rl", {"rl": {"clip_eps": 1.5}}, ["`rl.clip_eps` must be in (0, 1), got 1.5"]),
    "unknown-method": (
        "rl",
        {"rl": {"method": "ppo"}},
        ["`rl.method` must be one of ['grpo', 'seed', 'grpo_opsd', 'sdar', 'seed_shuffled', 'seed_oracle'], got 'ppo'"],
    ),
    "unknown-advantage": (
        "rl",
        {"rl": {"advantage": "gae"}},
        ["`rl.advantage` must be one of ['grpo', 'gigpo'], got 'gae'"],
    ),
    "ranks-without-launcher": (
        "rl",
        {"rl": {"world_size": 2}},
        ["`rl.world_size` is 2, but rl.launcher local trains in one process; set rl.launcher: torchrun"],
    ),
    "more-ranks-than-games": (
        "rl",
        {"rl": {"launcher": "torchrun", "world_size": 4, "games_per_update": 2}},
        ["`rl.world_size` is 4, more than rl.games_per_update (2)", "raise rl.games_per_update or lower rl.world_size"],
    ),
    "unknown-launcher": (
        "rl",
        {"rl": {"launcher": "slurm"}},
        ["`rl.launcher` must be one of ['local', 'torchrun', 'ray'], got 'slurm'"],
    ),
    "missing-model-path": (
        "prepare",
        {"model": {"name_or_path": "{tmp}/no-such-model"}},
        [
            "`model.name_or_path` is '{tmp}/no-such-model', which does not exist",
            "a local folder holding an HF checkpoint with safetensors weights",
            "an HF model id",
            "'smollm2-135m-instruct'",
        ],
    ),
}
if not torch.cuda.is_available():  # CI and this project's CPU machines
    CASES["cuda-without-gpu"] = (
        "rl",
        {"model": {"device": "cuda"}},
        ["`model.device` is cuda, but torch sees no CUDA device here", "set model.device to auto or cpu"],
    )


def previous_outputs(root: Path) -> None:
    """Outputs of an earlier run, which a refused run must leave exactly as they are."""
    for rel, text in {
        "data/manifests/train.json": '{"games": []}\n',
        "models/base/config.json": "{}\n",
        "metrics/rl.json": '{"method": "seed"}\n',
        "runs/rl/seed-grpo-s0-0123456789/run.json": "{}\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.e2e  # each case starts the stage command
@pytest.mark.fault("params")
@pytest.mark.parametrize("case", list(CASES))
def test_stage_command_refuses_bad_params_before_any_work(case, tmp_path):
    stage, raw, messages = CASES[case]
    project = tmp_path / "project"
    project.mkdir()
    previous_outputs(project)
    raw = yaml.safe_load(yaml.safe_dump(raw).replace("{tmp}", str(tmp_path)))
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    before = listing(project)
    prefect_home = tmp_path / "prefect-home"
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)  # no server: a flow run would start a temporary one in PREFECT_HOME

    with intact(project):
        proc = subprocess.run(
            [sys.executable, str(REPO / "flows" / f"{stage}.py")],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    assert proc.returncode == 2, proc.stdout + proc.stderr
    for m in messages:
        assert m.replace("{tmp}", str(tmp_path)) in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: params: ") and proc.stderr.count("\n") == 1, proc.stderr  # one line
    assert "Traceback" not in proc.stderr and "Beginning flow run" not in proc.stdout + proc.stderr
    assert listing(project) == before  # nothing created either
    assert not (prefect_home / "prefect.db").exists()  # no Prefect server was started


@pytest.mark.fault("params", n=2)
def test_prepare_refuses_a_missing_model_path_before_writing_manifests(tmp_path):
    """The flow function itself (as a Prefect deployment calls it, without the command-line pre-check)."""
    from seed_core.config import params_from_dict
    from seed_core.models import ModelError
    from seed_core.stages.prepare import run_prepare

    previous_outputs(tmp_path)
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "notes.txt").write_text("weights went missing\n")
    for folder, found in (("no-such-model", "does not exist"), ("not-a-model", "holds no HF checkpoint")):
        params = params_from_dict({"model": {"name_or_path": str(tmp_path / folder)}})
        before = listing(tmp_path)
        with intact(tmp_path), pytest.raises(ModelError) as e:
            run_prepare(params, tmp_path / "models/base", tmp_path / "data/manifests")
        assert f"`model.name_or_path` is '{tmp_path / folder}', which {found}" in str(e.value)
        assert listing(tmp_path) == before
