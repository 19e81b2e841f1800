"""Evaluation metrics against hand-computed numbers."""

import pytest

from seed_core.config import Params
from seed_core.records import Trajectory
from seed_core.rollout import summarize
from seed_core.stages.eval_table import markdown_table
from seed_core.stages.evaluate import average_runs


def traj(task_type, won, length, invalid):
    return Trajectory(
        traj_id="x",
        game_id=f"valid_seen/{task_type}-A-None-B-1/t",
        split="valid_seen",
        task_type=task_type,
        task="t",
        group_id="g",
        sample_idx=0,
        won=won,
        episode_return=0.0,
        length=length,
        invalid_count=invalid,
    )


def test_summarize_hand_computed():
    trajs = [
        traj("pick_and_place_simple", True, 4, 0),
        traj("pick_and_place_simple", True, 6, 1),
        traj("pick_and_place_simple", False, 10, 2),
        traj("look_at_obj_in_light", False, 10, 5),
    ]
    m = summarize(trajs)
    assert m["success/pick_and_place_simple"] == pytest.approx(2 / 3)
    assert m["success/look_at_obj_in_light"] == 0.0
    assert "success/pick_two_obj_and_place" not in m  # absent types are not counted as 0
    assert m["success/macro"] == pytest.approx((2 / 3 + 0) / 2)  # 0.3333
    assert m["success/micro"] == pytest.approx(2 / 4)
    assert m["invalid_rate"] == pytest.approx(8 / 30)
    assert m["episode_length"] == pytest.approx(30 / 4)


def test_average_runs_and_table():
    a = {
        "success/macro": 0.5,
        "success/micro": 0.25,
        "invalid_rate": 0.1,
        "episode_length": 8.0,
        "success/look_at_obj_in_light": 0.5,
    }
    b = {
        "success/macro": 0.7,
        "success/micro": 0.75,
        "invalid_rate": 0.3,
        "episode_length": 6.0,
        "success/look_at_obj_in_light": 1.0,
    }
    m = average_runs([a, b])
    assert m["success/macro"] == pytest.approx(0.6) and m["success/micro"] == pytest.approx(0.5)
    assert m["success/macro_std"] == pytest.approx(0.1) and m["success/micro_std"] == pytest.approx(0.25)
    assert m["runs"] == 2
    table = markdown_table({"base": {"valid_seen": {"sampled": m}}})
    assert "| base | valid_seen | sampled | – | 75.0 | – | – | – | – | 60.0 | 50.0 | 20.0 | 7.0 | 2 |" in table
    assert "macro avg" in table and "micro avg" in table
    assert "| model | split | mode | pick | look | clean | heat | cool | pick2 | macro avg |" in table


def test_update_statistics_reduce_by_their_declared_operation():
    from seed_core.method.update import STAT_REDUCTION, StatSums

    sums = StatSums()
    sums.add({"loss/pg": 1.0, "mismatch/abs_max": 0.5}, tokens=1)
    sums.add({"loss/pg": 4.0, "mismatch/abs_max": 0.2}, tokens=3)
    # token-weighted mean (1*1 + 4*3) / 4, and the largest value
    assert sums.merged() == {"loss/pg": 13 / 4, "mismatch/abs_max": 0.5}
    assert STAT_REDUCTION["mismatch/abs_max"] == "max" and STAT_REDUCTION["loss/pg"] == "mean"
    with pytest.raises(KeyError, match="'train/new_stat' has no reduction: add it to method.update.STAT_REDUCTION"):
        sums.add({"train/new_stat": 1.0}, tokens=1)


def test_headline_holds_success_per_model_and_split_and_the_parse_rates():
    from seed_core.stages.eval_table import headline

    run = {"success/micro": 0.25, "success/macro": 0.5}
    results = {m: {"valid_seen": {"greedy": run, "sampled": {"success/micro": 0.9}}, "valid_unseen": {"greedy": run}}
               for m in ("base", "perception", "warmup", "analyzer", "rl")}  # fmt: skip
    sft_data = {"sft_data/parse_rate": 1.0}
    analyzer = {"analyzer/before/parse_rate": 0.0, "analyzer/after/parse_rate": 0.75}
    out = headline(results, sft_data, analyzer)
    assert out["seen/rl"] == 0.25 and out["unseen/analyzer"] == 0.25  # the first mode's, not the sampled one
    assert (out["parse/teacher"], out["parse/before"], out["parse/after"]) == (1.0, 0.0, 0.75)
    assert len(out) == 13 and headline(results).keys() == {k for k in out if not k.startswith("parse/")}
    # `dvc metrics show` of the default evaluation (base, warm-up, RL): the path column, then one column per key,
    # each as wide as its key or a 5-digit value
    default = headline({m: results[m] for m in Params().evaluate.models}, sft_data, analyzer)
    assert len(default) == 9
    width = len("metrics/headline.json") + sum(max(len(k), len("0.12345")) + 2 for k in default)
    assert width <= 160, width
