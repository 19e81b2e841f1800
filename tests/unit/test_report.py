"""Comparison report: 2 methods x 2 seeds of hand-made, consistent metric files, rendered and opened in headless
Chromium; the rendered DOM must show the means and 95% t-intervals worked out by hand below, and decoded plots.
Then the learning curves, the paired difference, the credit and skill statistics and the wall time, each on
hand-made runs with numbers worked out by hand."""

import base64
import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml

from seed_core.tools import cli
from seed_core.tools.report import (
    COLORS,
    ReportError,
    Run,
    discover,
    group,
    interval_band,
    learning_curve_summary,
    mean_ci,
    paired_difference,
    points,
    render,
    report_summary,
    t_quantile,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PICK, LOOK = "pick_and_place_simple", "look_at_obj_in_light"

# valid_seen has 3 pick games and 1 look game: (pick won, look won) per run
WON = {"grpo-s0": (1, 0), "grpo-s1": (2, 0), "seed-s0": (2, 1), "seed-s1": (3, 1)}
INVALID = {"grpo-s0": 0.1, "grpo-s1": 0.3, "seed-s0": 0.0, "seed-s1": 0.0}
VAL = {"grpo-s0": 0.5, "grpo-s1": 0.5, "seed-s0": 2 / 3, "seed-s1": 1.0}
GATE = {"seed-s0": 0.6, "seed-s1": 0.7}

# By hand, t(0.975, 1) = 12.706 and for two seeds a, b: half-width = 12.706 * |a - b| / 2.
#   grpo pick  1/3, 2/3 -> 50.0 ± 211.8   look 0, 0 -> 0.0 ± 0.0
#   grpo macro 1/6, 1/3 -> 25.0 ± 105.9   micro 1/4, 2/4 -> 37.5 ± 158.8   invalid .1, .3 -> 20.0 ± 127.1
#   seed pick  2/3, 1   -> 83.3 ± 211.8   look 1, 1 -> 100.0 ± 0.0
#   seed macro 5/6, 1   -> 91.7 ± 105.9   micro 3/4, 1   -> 87.5 ± 158.8
#   final val success: grpo .5, .5 -> 50.0 ± 0.0; seed 2/3, 1 -> 83.3 ± 211.8; seed opd/gate_mean .6, .7 -> 0.65 ± 0.635
#   paired macro, seed - grpo: s0 5/6 - 1/6, s1 1 - 1/3 -> 2/3 both -> 66.7 ± 0.0
EXPECTED = {
    f"valid_seen/greedy/grpo/success/{PICK}": "50.0 ± 211.8",
    f"valid_seen/greedy/grpo/success/{LOOK}": "0.0 ± 0.0",
    "valid_seen/greedy/grpo/success/macro": "25.0 ± 105.9",
    "valid_seen/greedy/grpo/success/micro": "37.5 ± 158.8",
    "valid_seen/greedy/grpo/invalid_rate": "20.0 ± 127.1",
    f"valid_seen/greedy/seed/success/{PICK}": "83.3 ± 211.8",
    f"valid_seen/greedy/seed/success/{LOOK}": "100.0 ± 0.0",
    "valid_seen/greedy/seed/success/macro": "91.7 ± 105.9",
    "valid_seen/greedy/seed/success/micro": "87.5 ± 158.8",
    "opd/grpo/val/success_rate": "50.0 ± 0.0",
    "opd/seed/val/success_rate": "83.3 ± 211.8",
    "opd/seed/opd/gate_mean": "0.65 ± 0.635",
    "opd/grpo/opd/gate_mean": "–",
    "paired/seed/valid_seen/greedy": "66.7 ± 0.0",
}


def skill(n, d, tokens=40):
    return {
        "traj_id": f"t{n}",
        "task_type": PICK,
        "outcome": "success",
        "skill": f"Rule number {n}: go to cabinet {n}.",
        "parse_status": "ok",
        "rescore": {"tokens": tokens, "delta_mean": d, "gate_mean": 0.5},
    }


def make_results(root: Path) -> Path:
    results = root / "results"
    for name, (pick, look) in WON.items():
        method, seed = name.split("-s")
        d = results / name
        (d / "metrics").mkdir(parents=True)
        (d / "params.yaml").write_text(
            yaml.safe_dump({"rl": {"method": method, "seed": int(seed), "epochs": 2}, "prepare": {"seed": int(seed)}})
        )
        m = {
            f"success/{PICK}": pick / 3,
            f"success/{LOOK}": look / 1,
            "success/macro": (pick / 3 + look) / 2,
            "success/micro": (pick + look) / 4,
            "invalid_rate": INVALID[name],
            "episode_length": 5.0,
            "runs": 1,
        }
        (d / "metrics/eval.json").write_text(
            json.dumps({"base": {"valid_seen": {"greedy": m}}, "rl": {"valid_seen": {"greedy": m}}})
        )
        mean = {"skills/parse_rate": 1.0, "opd/gate_mean": GATE[name]} if method == "seed" else {}
        (d / "metrics/rl.json").write_text(
            json.dumps(
                {
                    "mean_over_updates": mean,
                    "validation": [{"epoch": 1, "val/success_rate": 0.0}, {"epoch": 2, "val/success_rate": VAL[name]}],
                }
            )
        )
        ups = [
            {
                "update": u,
                "rollout/success_rate": (u + int(seed)) / 4,
                **({"opd/gate_mean": 0.5 + u / 10, "skills/parse_rate": 1.0} if method == "seed" else {}),
            }
            for u in range(3)
        ]
        (d / "metrics/rl_updates.json").write_text(json.dumps(ups))
    (results / "seed-s0/skills.jsonl").write_text("".join(json.dumps(s) + "\n" for s in (skill(1, 0.1), skill(2, 0.3))))
    (results / "seed-s1/skills.jsonl").write_text(
        json.dumps(skill(3, 0.9, tokens=0)) + "\n"
    )  # not re-scored: not a sample
    (results / "sweep.json").write_text(
        json.dumps(
            [{"name": n, "status": "success"} for n in WON]
            + [{"name": "seed-s2", "status": "failed", "error": "rl: loss is NaN"}]
        )
    )
    return results


def test_t_interval_by_hand():
    m, h = mean_ci([0.1, 0.2, 0.3])  # s = 0.1, t(0.975, 2) = 4.303
    assert m == pytest.approx(0.2) and h == pytest.approx(4.303 * 0.1 / 3**0.5)
    assert mean_ci([0.4]) == (0.4, None)
    assert t_quantile(1) == 12.706 and t_quantile(45) == 2.021 and t_quantile(500) == 1.980


def test_grouping_refuses_mixed_params_and_missing_files(tmp_path):
    results = make_results(tmp_path)
    runs, failed = discover([str(results)])
    assert [(r.method, r.seed) for r in runs] == [("grpo", "0"), ("grpo", "1"), ("seed", "0"), ("seed", "1")]
    assert failed == [{"name": "seed-s2", "status": "failed", "error": "rl: loss is NaN"}]
    p = results / "seed-s1/params.yaml"
    p.write_text(p.read_text().replace("epochs: 2", "epochs: 3"))
    with pytest.raises(
        ReportError,
        match=r"runs seed-s0 and seed-s1 are seeds of method 'seed' by name but their params.yaml differ in rl.epochs",
    ):
        group(discover([str(results)])[0])
    (results / "grpo-s0/metrics/eval.json").unlink()
    with pytest.raises(ReportError, match=r"grpo-s0/metrics/eval.json is missing"):
        discover([str(results / "grpo-s0")])


def test_cli_errors(tmp_path, capsys):
    results = make_results(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(["report", str(results), "--model", "warmup", "--out", str(tmp_path / "r.html")])
    assert e.value.code == 2 and "has no model 'warmup' (it has ['base', 'rl'])" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["report", str(tmp_path / "nope")])
    assert "is not a folder" in capsys.readouterr().err


def rendered_dom(page: Path, tmp_path: Path) -> str:
    """The page as Chromium renders it, after a load handler (added to a copy) recorded each image's decoded size."""
    probe = tmp_path / "probe.html"
    script = (
        "<script>window.addEventListener('load', () => document.querySelectorAll('img').forEach(i => {"
        "i.setAttribute('data-natural-width', i.naturalWidth); i.setAttribute('data-natural-height', i.naturalHeight);}));</script>"
    )
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "<table" in proc.stdout, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.e2e
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian package `chromium`: apt-get install -y chromium)",
)
def test_report_renders_in_chromium(tmp_path, capsys):
    results = make_results(tmp_path)
    page = tmp_path / "report.html"
    cli.main(["report", str(results), "--out", str(page)])
    assert capsys.readouterr().out.strip() == f"wrote {page} and {page.with_suffix('.json')} (its numbers)"
    source = page.read_text()
    assert 'src="http' not in source and "<link" not in source  # self-contained
    dom = rendered_dom(page, tmp_path)

    cells = dict(re.findall(r'<td data-key="([^"]+)"[^>]*>([^<]*)</td>', dom))
    for key, text in EXPECTED.items():
        assert cells.get(key) == text, key
    assert re.search(r"<th>grpo</th><td>2</td>", dom) and re.search(r"<th>seed</th><td>2</td>", dom)

    imgs = re.findall(
        r'<img class="chart" alt="([^"]+)"[^>]*data-natural-width="(\d+)" data-natural-height="(\d+)"', dom
    )
    assert imgs == [
        ("rollout/success_rate", "640", "300"),
        ("val/success_rate", "640", "300"),
        ("opd/gate_mean", "640", "300"),
        ("skills/parse_rate", "640", "300"),
    ]

    assert "seed-s2: failed — rl: loss is NaN" in dom
    samples = re.findall(r'<li class="skill"><b>Δ ([^<]+)</b>', dom)
    assert samples == ["+0.3000", "+0.1000"]  # seed's re-scored skills, largest Δ first; grpo has none
    assert '<th>rl.method</th><td>"grpo"</td><td>"seed"</td>' in dom  # what distinguishes the methods
    assert '<td class="paired-seeds">paired over seeds 0, 1</td><td>s0 +66.7, s1 +66.7</td>' in dom


# Learning curves: 3 seeds of grpo, 2 epochs x 2 updates. Training success per update, validation per epoch:
TRAIN = {0: [0.0, 0.5, 0.5, 1.0], 1: [0.25, 0.25, 0.5, 0.5], 2: [0.0, 0.25, 0.75, 0.75]}
VALID = {0: [0.2, 0.4], 1: [0.3, 0.6], 2: [0.1, 0.5]}
# By hand, t(0.975, 2) = 4.303 and half-width = 4.303 * s / sqrt(3):
#   epoch means per seed: s0 .25 .75, s1 .25 .5, s2 .125 .75
#   train epoch 1: .25 .25 .125 -> mean 5/24, deviations (1, 1, -2)/24, s/sqrt(3) = 1/24 -> 20.8 ± 17.9
#   train epoch 2: .75 .5 .75   -> mean 2/3,  deviations (1, -2, 1)/12, s/sqrt(3) = 1/12 -> 66.7 ± 35.9
#   mean over all updates: .5 .375 .4375 -> mean .4375, s = 1/16 -> 43.8 ± 15.5
#   validation: .2 .3 .1 -> 20.0 ± 24.8; .4 .6 .5 -> 50.0 ± 24.8 (s = .1 both)
CURVE_HW = {"e1": 4.303 / 24, "e2": 4.303 / 12, "auc": 4.303 / 16 / 3**0.5, "val": 4.303 * 0.1 / 3**0.5}


def make_curves(root: Path, extra: dict[str, dict] | None = None) -> Path:
    """results/ with grpo-s0..2 (TRAIN, VALID) plus `extra` runs {name: {"train": [...], "rl": rl.json or None}}."""
    results = root / "results"
    runs = {
        f"grpo-s{s}": {
            "train": TRAIN[s],
            "rl": {"validation": [{"epoch": e + 1, "val/success_rate": v} for e, v in enumerate(VALID[s])]},
        }
        for s in TRAIN
    }
    for name, run in {**runs, **(extra or {})}.items():
        method, seed = name.split("-s")
        d = results / name
        (d / "metrics").mkdir(parents=True)
        (d / "params.yaml").write_text(
            yaml.safe_dump({"rl": {"method": method, "seed": int(seed), "epochs": 2, "updates_per_epoch": 2}})
        )
        (d / "metrics/eval.json").write_text(json.dumps({"rl": {"valid_seen": {"greedy": {"success/micro": 0.5}}}}))
        ups = [{"update": u, "rollout/success_rate": y} for u, y in enumerate(run["train"])]
        (d / "metrics/rl_updates.json").write_text(json.dumps(ups))
        if run["rl"] is not None:
            (d / "metrics/rl.json").write_text(json.dumps({"mean_over_updates": {}, **run["rl"]}))
    return results


def cells_of(page: str) -> dict[str, str]:
    return dict(re.findall(r'<td data-key="([^"]+)"[^>]*>([^<]*)</td>', page))


def charts_of(page: str) -> dict[str, str]:
    """{metric: svg} of the page's embedded charts."""
    found = re.findall(r'<img class="chart" alt="([^"]+)" src="data:image/svg\+xml;base64,([^"]+)">', page)
    return {alt: base64.b64decode(data).decode() for alt, data in found}


def bands(svg: str) -> list[tuple[str, list[tuple[float, float]]]]:
    """(colour, outline points) of each shaded interval polygon."""
    return [
        (color, [tuple(map(float, p.split(","))) for p in pts.split()])
        for pts, color in re.findall(r'<polygon class="band" points="([^"]+)" fill="([^"]+)"', svg)
    ]


def test_learning_curve_numbers_by_hand(tmp_path):
    groups = group(discover([str(make_curves(tmp_path))])[0])
    summary = learning_curve_summary(groups)["grpo"]
    assert summary["seeds"] == 3
    (m1, h1), (m2, h2) = summary["train_success_by_epoch"]
    assert (m1, h1, m2, h2) == pytest.approx((5 / 24, CURVE_HW["e1"], 2 / 3, CURVE_HW["e2"]))
    (v1, hv1), (v2, hv2) = summary["val_success_by_epoch"]
    assert (v1, hv1, v2, hv2) == pytest.approx((0.2, CURVE_HW["val"], 0.5, CURVE_HW["val"]))
    assert summary["train_success_auc"] == pytest.approx([0.4375, CURVE_HW["auc"]])

    cells = cells_of(render([r for rs in groups.values() for r in rs]))
    assert {k: v for k, v in cells.items() if k.startswith("curves/")} == {
        "curves/grpo/rollout/success_rate/epoch_1": "20.8 ± 17.9",
        "curves/grpo/rollout/success_rate/epoch_2": "66.7 ± 35.9",
        "curves/grpo/val/success_rate/epoch_1": "20.0 ± 24.8",
        "curves/grpo/val/success_rate/epoch_2": "50.0 ± 24.8",
        "curves/grpo/rollout/success_rate/all_updates": "43.8 ± 15.5",
    }


def test_validation_sits_at_the_last_update_of_its_epoch(tmp_path):
    groups = group(discover([str(make_curves(tmp_path))])[0])
    assert points(groups["grpo"][0], "val/success_rate") == [(1, 0.2), (3, 0.4)]  # 2 updates per epoch
    five = Run(
        "r",
        tmp_path,
        "m",
        "0",
        {"rl": {"updates_per_epoch": 5}},
        {},
        rl=json.loads('{"validation": [{"epoch": 1, "val/success_rate": 0.1}, {"epoch": 2, "val/success_rate": 0.3}]}'),
    )
    assert points(five, "val/success_rate") == [(4, 0.1), (9, 0.3)]

    # the validation chart comes right after training success, its band the interval at updates 1 and 3:
    # x spans 1..3 over 410 px from 60; a rate spans 0..1 over 230 px from 30 (top)
    svg = charts_of(render([r for rs in groups.values() for r in rs]))
    assert list(svg)[:2] == ["rollout/success_rate", "val/success_rate"]
    [(color, outline)] = bands(svg["val/success_rate"])
    hw = CURVE_HW["val"]
    expect = [(60, 0.2 + hw), (470, 0.5 + hw), (470, 0.5 - hw), (60, 0.2 - hw)]  # upper edge, then lower back
    assert color == COLORS[0]
    assert [c for pt in outline for c in pt] == pytest.approx(
        [c for x, y in expect for c in (x, 30 + (1 - y) * 230)], abs=0.06
    )


def test_band_needs_two_seeds(tmp_path):
    results = make_curves(
        tmp_path,
        {
            "seed-s0": {
                "train": [0.5, 0.5, 1.0, 1.0],
                "rl": {"validation": [{"epoch": 1, "val/success_rate": 0.5}, {"epoch": 2, "val/success_rate": 0.75}]},
            }
        },
    )
    groups = group(discover([str(results)])[0])
    svg = charts_of(render([r for rs in groups.values() for r in rs]))
    for metric in ("rollout/success_rate", "val/success_rate"):
        assert [c for c, _ in bands(svg[metric])] == [COLORS[0]], metric  # grpo (3 seeds) only, not seed (1)
        assert svg[metric].count('class="band"') == 1
        assert svg[metric].index('class="band"') < svg[metric].index("<polyline")  # under every line
    assert len(bands(svg["rollout/success_rate"])[0][1]) == 8  # 4 updates, upper edge and lower edge
    one = learning_curve_summary(groups)["seed"]
    assert one["train_success_by_epoch"] == [[0.5, None], [1.0, None]] and one["train_success_auc"] == [0.75, None]
    # the band breaks where fewer than 2 seeds have a value, rather than bridging it
    assert interval_band({0: [0.0, 1.0], 1: [0.5], 2: [0.2, 0.2], 3: [0.4, 0.4]}) == [
        [(0, 0.5 - 12.706 * 0.5, 0.5 + 12.706 * 0.5)],
        [(2, 0.2, 0.2), (3, 0.4, 0.4)],
    ]


def test_runs_without_validation_have_no_validation_values(tmp_path):
    # seed-s0 ran without a validation panel (rl.json logs {"epoch": e} alone); seed-s1 has no rl.json
    results = make_curves(
        tmp_path,
        {
            "seed-s0": {"train": [0.5, 0.5, 1.0, 1.0], "rl": {"validation": [{"epoch": 1}, {"epoch": 2}]}},
            "seed-s1": {"train": [0.0, 0.5, 0.5, 1.0], "rl": None},
        },
    )
    groups = group(discover([str(results)])[0])
    summary = learning_curve_summary(groups)["seed"]
    assert summary["val_success_by_epoch"] == []
    (m1, h1), (m2, h2) = summary["train_success_by_epoch"]  # seeds .5 and .25, then 1 and .75: |a - b| / 2 = .125
    assert (m1, h1, m2, h2) == pytest.approx((0.375, 12.706 * 0.125, 0.875, 12.706 * 0.125))
    page = render([r for rs in groups.values() for r in rs])
    cells = cells_of(page)
    assert cells["curves/seed/val/success_rate/epoch_1"] == cells["curves/seed/val/success_rate/epoch_2"] == "–"
    assert cells["curves/grpo/val/success_rate/epoch_2"] == "50.0 ± 24.8"
    svg = charts_of(page)
    assert [c for c, _ in bands(svg["val/success_rate"])] == [COLORS[0]]
    assert ">seed (mean of 2)<" in svg["rollout/success_rate"] and ">seed (mean" not in svg["val/success_rate"]


def test_cli_writes_the_summary_next_to_the_page(tmp_path, capsys):
    results = make_curves(tmp_path)
    page = tmp_path / "report.html"
    cli.main(["report", str(results), "--out", str(page)])
    assert capsys.readouterr().out.strip() == f"wrote {page} and {page.with_suffix('.json')} (its numbers)"
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["grpo"]["train_success_auc"] == pytest.approx([0.4375, CURVE_HW["auc"]])
    groups = group(discover([str(results)])[0])
    assert written == report_summary(groups)
    assert {k: written["grpo"][k] for k in learning_curve_summary(groups)["grpo"]} == learning_curve_summary(groups)[
        "grpo"
    ]
    # one method, no rl_updates time or credit keys: the new sections are empty, and nothing to pair with
    assert (written["grpo"]["credit"], written["grpo"]["skills"], written["grpo"]["wall_time_s"]) == ({}, {}, {})
    assert "paired_difference" not in written["grpo"]
    with pytest.raises(SystemExit) as e:
        cli.main(["report", str(results), "--out", str(tmp_path / "report.json")])
    assert e.value.code == 2 and "ends in .json, where the report's numbers go" in capsys.readouterr().err


# Arms: grpo seeds 0, 1, 2 and seed seeds 0, 1, 3, two updates each. Per run: the final macro success on
# valid_seen (greedy) and its rl_updates.json rows. Seeds 2 (grpo only) and 3 (seed only) have no pair.
MACRO = {"grpo-s0": 0.2, "grpo-s1": 0.1, "grpo-s2": 0.9, "seed-s0": 0.3, "seed-s1": 0.4, "seed-s3": 0.0}
UPDATES = {
    "grpo-s0": {
        "credit/auc_within/advantage": [0.5, 0.5],
        "credit/auc/advantage": [0.6, 0.8],
        "credit/optimal_frac": [0.25, 0.25],
        "time/rollout_s": [10, 20],
        "time/analysis_s": [0, 0],
        "time/rescore_s": [1, 2],
        "time/update_s": [30, 40],
    },
    "grpo-s1": {
        "credit/auc_within/advantage": [0.5, 0.5],
        "credit/auc/advantage": [0.6, 0.6],
        "credit/optimal_frac": [0.25, 0.25],
        "time/rollout_s": [12, 18],
        "time/analysis_s": [0, 0],
        "time/rescore_s": [2, 2],
        "time/update_s": [35, 45],
    },
    "grpo-s2": {  # no analysis phase logged: the total is that of the other three
        "credit/auc_within/advantage": [0.5, 0.5],
        "credit/auc/advantage": [0.5, 0.5],
        "credit/optimal_frac": [0.25, 0.25],
        "time/rollout_s": [20, 20],
        "time/rescore_s": [3, 3],
        "time/update_s": [40, 40],
    },
    "seed-s0": {
        "credit/auc_within/gate": [0.6, 0.8],
        "credit/auc/gate": [0.5, 0.7],
        "skills/parse_rate": [1.0, 0.5],
        "skills/consistent": [0.5, 1.0],
    },
    "seed-s1": {
        "credit/auc_within/gate": [0.4, 0.6],
        "credit/auc/gate": [0.5, None],  # not logged at update 1 (no pair to compare): mean of update 0 alone
        "skills/parse_rate": [1.0, 1.0],
        "skills/consistent": [0.25, 0.25],
    },
    "seed-s3": {"skills/parse_rate": [0.5, 0.5]},  # no credit probe, no consistency check
}
# By hand (t(0.975, 1) = 12.706, t(0.975, 2) = 4.303):
#   paired seed - grpo: s0 .3 - .2 = .1, s1 .4 - .1 = .3 -> mean .2, s = .1 * sqrt(2) -> ± 12.706 * .1 = 1.2706
#   credit, per seed the mean over updates:
#     grpo auc/advantage .7 .6 .5 -> .6 ± 4.303 * .1 / sqrt(3); auc_within/advantage .5 .5 .5 -> .5 ± 0
#     seed auc_within/gate .7 .5 -> .6 ± 12.706 * .1; auc/gate .6 .5 -> .55 ± 12.706 * .05
#   skills: parse_rate .75 1 .5 -> .75 ± 4.303 * .25 / sqrt(3); consistent .75 .25 -> .5 ± 12.706 * .25
#   wall time, per run the sum over updates: rollout 30 30 40 -> 33.33 ± 4.303 * 5.7735 / sqrt(3) = 14.34;
#     analysis 0 0 (s2 none); rescore 3 4 6; update 70 80 80; total 103 114 126 -> 114.33, s = 11.504 -> ± 28.58
T1, T2 = 12.706, 4.303


def flat(d: dict[str, list]) -> dict[tuple[str, int], float]:
    """{(key, i): d[key][i]}: pytest.approx compares flat mappings only."""
    return {(k, i): x for k, v in d.items() for i, x in enumerate(v)}


def make_arms(root: Path) -> Path:
    results = root / "results"
    for name, macro in MACRO.items():
        method, seed = name.split("-s")
        d = results / name
        (d / "metrics").mkdir(parents=True)
        (d / "params.yaml").write_text(
            yaml.safe_dump({"rl": {"method": method, "seed": int(seed), "epochs": 1, "updates_per_epoch": 2}})
        )
        m = {"success/macro": macro, "success/micro": macro}
        (d / "metrics/eval.json").write_text(json.dumps({"rl": {"valid_seen": {"greedy": m}}}))
        ups = [
            {"update": u, "rollout/success_rate": 0.5} | {k: v[u] for k, v in UPDATES[name].items() if v[u] is not None}
            for u in range(2)
        ]
        (d / "metrics/rl_updates.json").write_text(json.dumps(ups))
    return results


def test_paired_difference_by_hand(tmp_path):
    groups = group(discover([str(make_arms(tmp_path))])[0])
    d = paired_difference(groups)["seed"]["valid_seen"]["greedy"]
    assert (d["baseline"], d["metric"], d["seeds"]) == ("grpo", "success/macro", [0, 1])  # 2 and 3 have no pair
    assert d["diffs"] == pytest.approx([0.1, 0.3])
    assert (d["mean"], d["ci"]) == pytest.approx((0.2, T1 * statistics.stdev([0.1, 0.3]) / 2**0.5))
    assert d["ci"] == pytest.approx(1.2706)
    assert d["left_out"] == {"seed": [3], "grpo": [2]}
    assert list(paired_difference(groups)) == ["seed"]  # not the baseline against itself
    assert report_summary(groups)["seed"]["paired_difference"]["valid_seen"]["greedy"] == d
    assert "paired_difference" not in report_summary(groups)["grpo"]

    page = render([r for rs in groups.values() for r in rs])
    assert cells_of(page)["paired/seed/valid_seen/greedy"] == "20.0 ± 127.1"
    assert (
        '<td class="paired-seeds">paired over seeds 0, 1; seed 3 left out (seed only); seed 2 left out (grpo only)</td>'
        "<td>s0 +10.0, s1 +30.0</td>"
    ) in page
    # another baseline: seed's seeds against grpo's, the signs flipped; a baseline that is not there: no pairing
    flipped = paired_difference(groups, baseline="seed")["grpo"]["valid_seen"]["greedy"]
    assert flipped["diffs"] == pytest.approx([-0.1, -0.3]) and flipped["left_out"] == {"grpo": [2], "seed": [3]}
    assert paired_difference(groups, baseline="sdar") == {}
    assert "the baseline method <code>sdar</code> is not among the runs" in render(
        [r for rs in groups.values() for r in rs], baseline="sdar"
    )


def test_credit_and_skills_by_hand(tmp_path):
    groups = group(discover([str(make_arms(tmp_path))])[0])
    summary = report_summary(groups)
    grpo, seed = summary["grpo"]["credit"], summary["seed"]["credit"]
    assert set(grpo) == {"credit/auc_within/advantage", "credit/auc/advantage", "credit/optimal_frac"}  # no gate
    assert grpo["credit/auc/advantage"] == pytest.approx([0.6, T2 * 0.1 / 3**0.5])
    assert grpo["credit/auc_within/advantage"] == pytest.approx([0.5, 0.0])
    assert grpo["credit/optimal_frac"] == pytest.approx([0.25, 0.0])
    assert set(seed) == {"credit/auc_within/gate", "credit/auc/gate"}  # seed-s3 logged none: 2 seeds
    assert seed["credit/auc_within/gate"] == pytest.approx([0.6, T1 * 0.1])
    assert seed["credit/auc/gate"] == pytest.approx([0.55, T1 * 0.05])
    assert summary["grpo"]["skills"] == {}
    assert flat(summary["seed"]["skills"]) == pytest.approx(
        flat({"skills/parse_rate": [0.75, T2 * 0.25 / 3**0.5], "skills/consistent": [0.5, T1 * 0.25]})
    )

    page = render([r for rs in groups.values() for r in rs])
    cells = cells_of(page)
    assert cells["credit/seed/credit/auc_within/gate"] == "0.6 ± 1.27"
    assert cells["credit/seed/credit/auc/gate"] == "0.55 ± 0.635"
    assert cells["credit/grpo/credit/auc_within/gate"] == "–"
    assert cells["credit/grpo/credit/auc/advantage"] == f"0.6 ± {T2 * 0.1 / 3**0.5:.3g}"
    assert cells["skills/seed/skills/consistent"] == "0.5 ± 3.18"
    assert "skills/grpo/skills/parse_rate" not in cells  # a method with none of the keys has no row
    # credit charts: the AUCs in CREDIT_KEYS order, each with the dashed line at 0.5 (y = 30 + .5 * 230 px);
    # skills: parse rate and consistency; the learning-curve charts do not repeat them
    svg = charts_of(page)
    assert list(svg) == [
        "rollout/success_rate",
        "credit/auc_within/gate",
        "credit/auc_within/advantage",
        "credit/auc/gate",
        "credit/auc/advantage",
        "skills/parse_rate",
        "skills/consistent",
    ]
    for key in list(svg)[1:5]:
        assert re.search(r'<line class="ref" x1="60" x2="470" y1="145.0" y2="145.0"', svg[key]), key
    assert 'class="ref"' not in svg["skills/consistent"]
    assert ">seed (mean of 2)<" in svg["credit/auc_within/gate"] and ">grpo (mean" not in svg["credit/auc/gate"]
    assert [c for c, _ in bands(svg["credit/auc_within/gate"])] == [COLORS[1]]  # seed's colour: its place in groups
    assert ">seed (mean of 3)<" in svg["skills/parse_rate"] and ">seed (mean of 2)<" in svg["skills/consistent"]


def test_wall_time_sums_by_hand(tmp_path):
    groups = group(discover([str(make_arms(tmp_path))])[0])
    wall = report_summary(groups)["grpo"]["wall_time_s"]
    totals = [103, 114, 126]  # 30 + 0 + 3 + 70, 30 + 0 + 4 + 80, 40 + 6 + 80
    assert flat(wall) == pytest.approx(
        flat(
            {
                "time/rollout_s": [100 / 3, T2 * statistics.stdev([30, 30, 40]) / 3**0.5],
                "time/analysis_s": [0.0, T1 * 0.0],  # grpo-s2 did not log it: 2 seeds
                "time/rescore_s": [13 / 3, T2 * statistics.stdev([3, 4, 6]) / 3**0.5],
                "time/update_s": [230 / 3, T2 * statistics.stdev([70, 80, 80]) / 3**0.5],
                "time/total_s": [343 / 3, T2 * statistics.stdev(totals) / 3**0.5],
            }
        )
    )
    assert report_summary(groups)["seed"]["wall_time_s"] == {}
    cells = cells_of(render([r for rs in groups.values() for r in rs]))
    assert cells["wall/grpo/time/rollout_s"] == "33.3 ± 14.3"
    assert cells["wall/grpo/time/total_s"] == "114.3 ± 28.6"
    assert "wall/seed/time/total_s" not in cells


def test_timings_written_apart_are_merged_by_update(tmp_path):
    """The rl stage writes `time/*` to metrics/time/rl_updates.json: the report reads them from there."""
    run = tmp_path / "grpo-s0"
    (run / "metrics/time").mkdir(parents=True)
    (run / "params.yaml").write_text("rl:\n  seed: 0\n")
    (run / "metrics/eval.json").write_text(json.dumps({"rl": {"valid_seen": {"greedy": {"success/macro": 0.5}}}}))
    (run / "metrics/rl_updates.json").write_text(json.dumps([{"update": 0}, {"update": 1}]))
    (run / "metrics/time/rl_updates.json").write_text(
        json.dumps([{"update": 1, "time/update_s": 7.0}, {"update": 0, "time/update_s": 5.0}])
    )
    wall = report_summary(group(discover([str(run)])[0]))["grpo"]["wall_time_s"]
    assert wall["time/update_s"] == [12.0, None] and wall["time/total_s"] == [12.0, None]
