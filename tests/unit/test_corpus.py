"""Skill browser on hand-made corpora whose rule counts and mean Δ are worked out by hand below."""

import json

import pytest

from seed_core.tools import cli
from seed_core.tools.corpus import CorpusError, diff, find_corpora, load, normalize, rules, select

SEED_RUN, GRPO_RUN = "seed-grpo-s0-aaa", "grpo-grpo-s0-bbb"


def entry(n, task_type, outcome, status, skill, d, update, tokens=40):
    return {
        "traj_id": f"t{n}",
        "game_id": f"g{n}",
        "task_type": task_type,
        "outcome": outcome,
        "summary": "",
        "skill": skill,
        "parse_status": status,
        "raw_output": "{}",
        "producer": "policy",
        "prompt_hash": "h",
        "update": update,
        "trajectory": {
            "won": outcome == "success",
            "episode_return": 10.0 if outcome == "success" else 0.0,
            "length": 5,
            "invalid_count": 0,
            "task": "heat some mug and put it in fridge.",
            "actions": ["go to cabinet 1"],
        },
        "rescore": {"tokens": tokens, "delta_mean": d, "gate_mean": 0.5},
    }


CORPORA = {
    (SEED_RUN, 1): [
        entry(
            1,
            "pick_heat_then_place_in_recep",
            "success",
            "ok",
            "Go to cabinet 3 first. Take the mug 1. Heat it with microwave 1.",
            0.20,
            0,
        ),
        entry(2, "pick_heat_then_place_in_recep", "failure", "ok", "Go to cabinet 5 first. Do not loop.", 0.05, 0),
        entry(3, "look_at_obj_in_light", "failure", "failed", "", 0.0, 0, tokens=0),  # no skill: not re-scored
    ],
    (SEED_RUN, 2): [
        entry(
            4,
            "pick_heat_then_place_in_recep",
            "success",
            "ok",
            "Go to cabinet 1 first. Heat it with microwave 1. Put it in the fridge 2.",
            0.40,
            1,
        ),
        entry(
            5, "pick_and_place_simple", "success", "ok_after_reask", "Take the mug 2.  Put it in the fridge 1!", 0.10, 1
        ),
        entry(6, "pick_and_place_simple", "failure", "ok", "go to Cabinet 7 first.", -0.10, 1),
        entry(7, "pick_heat_then_place_in_recep", "failure", "ok", "Go to cabinet 2 first", 0.0, 1),
    ],
    (GRPO_RUN, 1): [entry(8, "pick_and_place_simple", "success", "ok", "Put it in the fridge 4.", 0.0, 0)],
}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    for (run, epoch), entries in CORPORA.items():
        d = tmp_path / "runs/rl" / run / f"epoch_{epoch:03d}"
        d.mkdir(parents=True)
        (d / "skills.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs/rl"


def test_normalize_and_rules():
    assert normalize("  Go to Cabinet 3 first.") == "go to cabinet N first"
    assert normalize("- heat it for 2.5 minutes;") == "heat it for N minutes"
    assert rules("1. Go to cabinet 3. 2. Go to cabinet 4.\nTake it!") == ["go to cabinet N", "take it"]


def test_find_load_and_filters(runs):
    files = find_corpora()  # the default glob, from the working directory
    assert [(f.parent.parent.name, f.parent.name) for f in files] == [
        (GRPO_RUN, "epoch_001"),
        (SEED_RUN, "epoch_001"),
        (SEED_RUN, "epoch_002"),
    ]
    assert find_corpora([str(runs / SEED_RUN)]) == [
        runs.parent.parent / f for f in files[1:]
    ]  # a run folder: its epochs
    assert find_corpora([str(runs / SEED_RUN / "epoch_002"), "runs/rl/*/epoch_002"]) == files[2:]  # counted once
    skills = load(files)
    assert len(skills) == 8 and skills[0]["run"] == GRPO_RUN and skills[0]["epoch"] == 1

    def ids(**kw):
        return [s["traj_id"] for s in select(skills, **kw)]

    assert ids(epochs=[2], task_types=["heat"]) == ["t4", "t7"]
    assert ids(outcomes=["failure"]) == ["t2", "t3", "t6", "t7"]
    assert ids(parse_statuses=["failed", "ok_after_reask"]) == ["t3", "t5"]
    assert ids(runs=["grpo-grpo"]) == ["t8"]
    assert ids(task_types=["pick_and_place"], runs=["seed"]) == ["t5", "t6"]


def test_diff_counts_by_hand(runs):
    a = load(find_corpora([str(runs / SEED_RUN / "epoch_001")]))
    b = load(find_corpora([str(runs / SEED_RUN / "epoch_002")]))
    d = diff(a, b, top=2)
    # "go to cabinet N first": A in t1 (0.20), t2 (0.05); B in t4 (0.40), t6 (-0.10), t7 (0.00)
    assert d["recurring"] == [
        {
            "rule": "go to cabinet N first",
            "count_a": 2,
            "count_b": 3,
            "delta_mean_a": pytest.approx(0.125),
            "delta_mean_b": pytest.approx(0.1),
        },
        {
            "rule": "heat it with microwave N",
            "count_a": 1,
            "count_b": 1,
            "delta_mean_a": pytest.approx(0.2),
            "delta_mean_b": pytest.approx(0.4),
        },
        {
            "rule": "take the mug N",
            "count_a": 1,
            "count_b": 1,
            "delta_mean_a": pytest.approx(0.2),
            "delta_mean_b": pytest.approx(0.1),
        },
    ]
    assert d["appeared"] == [
        {
            "rule": "put it in the fridge N",
            "count_a": 0,
            "count_b": 2,
            "delta_mean_a": None,
            "delta_mean_b": pytest.approx(0.25),
        }
    ]
    assert [r["rule"] for r in d["disappeared"]] == ["do not loop"]
    assert [(m["traj_id"], m["delta_mean"], m["same_text"]) for m in d["top_delta_b"]] == [
        ("t4", 0.40, 1),
        ("t5", 0.10, 1),
    ]
    assert [m["traj_id"] for m in d["top_delta_a"]] == ["t1", "t2"]
    assert d["a"]["parse_status"] == {"ok": 2, "failed": 1} and d["b"]["outcome"] == {"success": 2, "failure": 2}
    assert d["b"]["delta_mean"] == pytest.approx(0.1)
    assert (d["a"]["scored"], d["a"]["delta_mean"]) == (2, pytest.approx(0.125))  # t3 was not re-scored
    # ×n counts skills sharing the whole normalized text: t6 and t7 both say "go to cabinet N first"
    low = diff(a, b, top=4)["top_delta_b"]
    assert [(m["traj_id"], m["same_text"]) for m in low[2:]] == [("t7", 2), ("t6", 2)]


def test_cli_list_and_diff(runs, capsys):
    cli.main(["skills", str(runs / SEED_RUN), "--epoch", "2", "--sort", "delta", "--limit", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"{SEED_RUN} epoch 2 update 1  pick_heat_then_place_in_recep  success  parse=ok  Δmean=+0.4000  t4"
    )
    assert out[1] == "    Go to cabinet 1 first. Heat it with microwave 1. Put it in the fridge 2."
    assert out[2].startswith(
        f"{SEED_RUN} epoch 2 update 1  pick_and_place_simple  success  parse=ok_after_reask  Δmean=+0.1000  t5"
    )
    assert out[3] == "    Take the mug 2. Put it in the fridge 1!"  # whitespace collapsed
    assert out[4].startswith("2 skills;")

    cli.main(["skills", "diff", "1", "2", "--run", "seed-grpo", "--json"])  # epoch numbers, from the default location
    by_number = json.loads(capsys.readouterr().out)
    cli.main(["skills", "diff", str(runs / SEED_RUN / "epoch_001"), str(runs / SEED_RUN / "epoch_002"), "--json"])
    assert json.loads(capsys.readouterr().out) == by_number
    assert by_number["appeared"][0]["rule"] == "put it in the fridge N"

    cli.main(["skills", "diff", str(runs / GRPO_RUN), str(runs / SEED_RUN), "--top", "1"])  # two runs
    text = capsys.readouterr().out
    assert f"A: 1 skills from {GRPO_RUN} epochs [1]" in text
    assert "rules in both: 1\n" in text and "rules only in B (appeared): 4, top 1" in text
    assert (
        "  +0.4000 ×1  pick_heat_then_place_in_recep success (seed-grpo-s0-aaa epoch 2): Go to cabinet 1 first." in text
    )


@pytest.mark.fault("data")  # a corrupt corpus line (besides usage errors)
def test_cli_errors(runs, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["skills", "runs/rl/nope"])
    assert e.value.code == 2 and "no skill corpus at 'runs/rl/nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["skills", "diff", "1"])
    assert "usage: seed skills diff A B" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["skills", "diff", "1", "9"])
    assert "side B (9) has no skills after the filters" in capsys.readouterr().err
    bad = runs / GRPO_RUN / "epoch_001" / "skills.jsonl"
    bad.write_text(bad.read_text() + "{broken\n")
    with pytest.raises(CorpusError, match=r"skills.jsonl:2 is not valid JSON"):
        load([bad])
