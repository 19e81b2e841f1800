"""Comparison report: 2 methods x 2 seeds of hand-made, consistent metric files, rendered and opened in headless
Chromium; the rendered DOM must show the means and 95% t-intervals worked out by hand below, and decoded plots."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from seed_core.tools import cli
from seed_core.tools.report import ReportError, discover, group, mean_ci, t_quantile

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


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian package `chromium`: apt-get install -y chromium)",
)
def test_report_renders_in_chromium(tmp_path, capsys):
    results = make_results(tmp_path)
    page = tmp_path / "report.html"
    cli.main(["report", str(results), "--out", str(page)])
    assert capsys.readouterr().out.strip() == f"wrote {page}"
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
        ("opd/gate_mean", "640", "300"),
        ("skills/parse_rate", "640", "300"),
    ]

    assert "seed-s2: failed — rl: loss is NaN" in dom
    samples = re.findall(r'<li class="skill"><b>Δ ([^<]+)</b>', dom)
    assert samples == ["+0.3000", "+0.1000"]  # seed's re-scored skills, largest Δ first; grpo has none
    assert '<th>rl.method</th><td>"grpo"</td><td>"seed"</td>' in dom  # what distinguishes the methods
