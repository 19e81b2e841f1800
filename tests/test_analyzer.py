"""The train_analyzer stage end to end on a tiny random-init model (SFT set built by build_sft_data with the
oracle teacher), and the skill-quality measures it reports, on hand-made cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_sft_data import GAMES, SAMPLES, small_params, tiny_model_dir, train_manifest  # noqa: F401 (fixtures)

from helpers import read_stage_metrics
from seed_core.config import params_from_dict
from seed_core.envs.alfworld import Alfworld
from seed_core.models import load_model
from seed_core.records import Skill, Trajectory, read_jsonl
from seed_core.stages.build_sft_data import run_build_sft_data
from seed_core.stages.train_analyzer import (
    names_in,
    rehearsal_examples,
    run_train_analyzer,
    skill_quality,
    token_f1,
)


def test_token_f1_by_hand():
    assert token_f1("Go to the fridge 1.", "go to fridge 1") == pytest.approx(2 * (4 / 5) * 1 / (4 / 5 + 1))
    assert token_f1("same words", "Same, words!") == 1.0
    assert token_f1("", "anything") == 0.0 and token_f1("abc", "xyz") == 0.0


def test_names_in_matches_whole_instance_names():
    text = "The apple was in Cabinet 3, not in cabinet 31 or countertop 1."
    assert names_in(text, ["cabinet 3", "countertop 1", "fridge 1"]) == {"cabinet 3", "countertop 1"}
    assert names_in("check cabinet 31 first", ["cabinet 3"]) == set()


@pytest.fixture(scope="module")
def sft_set(alfworld_root, tiny_model_dir, train_manifest, tmp_path_factory) -> Path:  # noqa: F811
    tmp = tmp_path_factory.mktemp("sft")
    run_build_sft_data(
        small_params(alfworld_root, tmp), train_manifest, tiny_model_dir, tmp / "sft", tmp / "m.json", progress=False
    )
    return tmp / "sft"


def test_skill_quality_of_the_teacher_itself_is_perfect(alfworld_root, sft_set):
    trajs = list(read_jsonl(sft_set / "validation_trajectories.jsonl", Trajectory))
    reference = {s.traj_id: s for s in read_jsonl(sft_set / "skills.jsonl", Skill)}
    env = Alfworld(str(alfworld_root))
    same = skill_quality(trajs, [reference[t.traj_id] for t in trajs], reference, env)
    assert same["parse_rate"] == 1.0 and same["skill_token_f1"] == 1.0
    # The oracle's failure skills name where the target really was, so every trajectory is eligible.
    assert same["location_eligible"] == len(trajs) and same["target_location_hit"] == 1.0
    assert all(env.key_names(t) for t in trajs)
    unparsed = [Skill(**{**reference[t.traj_id].__dict__, "parse_status": "failed", "skill": ""}) for t in trajs]
    none = skill_quality(trajs, unparsed, reference, env)
    assert none["parse_rate"] == 0.0 and none["skill_token_f1"] == 0.0 and none["target_location_hit"] == 0.0


def test_train_analyzer_end_to_end(alfworld_root, tiny_model_dir, sft_set, tmp_path):  # noqa: F811
    params = params_from_dict(
        {
            "data": {"alfworld_data": str(alfworld_root)},
            "model": {"dtype": "float32"},
            "rollout": {"batch_size": 8},
            "build_sft_data": {"max_skill_chars": 1200},
            "train_analyzer": {
                "seed": 0,
                "epochs": 3.0,
                "learning_rate": 3e-3,
                "batch_size": 2,
                "lora_r": None,
                "max_seq_len": 4096,
                "analyzer_max_new_tokens": 24,
            },
        }
    )
    out, metrics_path, heldout = (
        tmp_path / "models" / "analyzer",
        tmp_path / "train_analyzer.json",
        tmp_path / "heldout.jsonl",
    )
    m = run_train_analyzer(params, sft_set, tiny_model_dir, out, metrics_path, heldout)

    assert read_stage_metrics(metrics_path) == m and "time/total_s" in m
    rows = [json.loads(line) for line in heldout.read_text().splitlines()]
    for when in ("before", "after"):
        assert m[f"analyzer/{when}/parse_rate"] == sum(r[f"{when}_status"] == "ok" for r in rows) / len(rows)
        f1 = [token_f1(r[f"{when}_skill"], r["teacher_skill"]) if r[f"{when}_status"] == "ok" else 0.0 for r in rows]
        assert m[f"analyzer/{when}/skill_token_f1"] == pytest.approx(sum(f1) / len(f1))
        assert f"analyzer/{when}/target_location_hit" in m
        assert m[f"analyzer/{when}/producer"].startswith("policy:")
    assert m["analyzer/before/producer"] != m["analyzer/after/producer"]  # different checkpoint hashes
    assert m["analyzer/heldout_trajectories"] == SAMPLES == m["analyzer/heldout_with_teacher_skill"]
    assert m["sft/data/examples"] == (GAMES - 1) * SAMPLES and m["sft/data/eval_examples"] == SAMPLES
    assert m["sft/eval/loss_after"] < m["sft/eval/loss_before"]
    assert m["sft/train/loss"] > 0

    rows = [json.loads(line) for line in heldout.read_text().splitlines()]
    assert len(rows) == SAMPLES and all(r["teacher_skill"] and r["target_locations"] for r in rows)
    assert {r["before_status"] for r in rows} | {r["after_status"] for r in rows} <= {"ok", "failed", "dropped"}

    assert sorted(p.name for p in out.parent.iterdir()) == ["analyzer"]  # no temp folders left
    model, tok = load_model(out)
    assert model.config.num_hidden_layers == 2 and tok.eos_token


def test_rehearsal_examples_are_the_first_warmup_games_expert_steps(alfworld_root, train_manifest):  # noqa: F811
    from seed_core.envs.alfworld.data import game_path, read_manifest
    from seed_core.envs.alfworld.expert import expert_examples, walkthrough_of

    params = params_from_dict(
        {
            "data": {"alfworld_data": str(alfworld_root)},
            "env": {"max_steps": 30, "workers": 0},
            "train_analyzer": {"rehearsal_games": 1},
        }
    )
    first = read_manifest(train_manifest, alfworld_root)[0]
    got = rehearsal_examples(params, train_manifest, Alfworld(str(alfworld_root)))
    walkthrough = walkthrough_of(game_path(alfworld_root, first.game_id))
    assert len(got) == len(walkthrough) > 0
    assert [x["completion"].rsplit("<action>", 1)[1].removesuffix("</action>") for x in got] == walkthrough
    assert got == [
        {"prompt": x["prompt"], "completion": x["completion"]}
        for x in expert_examples(alfworld_root, [first], params.env, progress=False)
    ]
    off = params_from_dict({"data": {"alfworld_data": str(alfworld_root)}})
    assert (
        rehearsal_examples(off, train_manifest, Alfworld(str(alfworld_root))) == []
    )  # the paper's setting: skills only
