"""Sweeps as DVC experiments (`seed sweep`), the dvc.yaml plots, and the default DVC remote, on tiny projects:
git + DVC with one stage whose command reads params.yaml and writes metrics like the rl stage does."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seed_core.config import ConfigError
from seed_core.tools.sweep import apply_overrides, check_combos, format_override, load_recipe, parse_set_params

pytestmark = pytest.mark.e2e  # DVC repos

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

STAGE = """\
import json, os, sys, yaml
p = yaml.safe_load(open("params.yaml"))["rl"]
run = f"runs/rl/{p['method']}-{p['advantage']}-s{p['seed']}-0123456789"
if os.path.exists(f"{run}/epoch_001/checkpoint"):  # like the rl stage: a run folder with a checkpoint resumes
    print(f"resuming {run} after epoch_001")
elif p["method"] == "sdar" and p["seed"] == 1:  # cut off after its first epoch
    os.makedirs(f"{run}/epoch_001")
    open(f"{run}/epoch_001/checkpoint", "w").write("weights")
    sys.exit("error: simulated stage failure for sdar seed 1")
os.makedirs("metrics", exist_ok=True)
os.makedirs("models/rl", exist_ok=True)
json.dump({"method": p["method"], "seed": p["seed"]}, open("metrics/rl.json", "w"))
json.dump([{"update": 0, "rollout/success_rate": p["seed"] / 10}], open("metrics/rl_updates.json", "w"))
open("models/rl/weights.bin", "w").write(p["method"] * 100)
# like the rl stage: runs/rl/<method>-<advantage>-s<seed>-<hash>/epoch_NNN/skills.jsonl; epoch 3 stands for a
# longer run with the same parameters, which shares the folder (params.yaml has rl.epochs 2)
for epoch in (1, 2, 3):
    os.makedirs(f"{run}/epoch_{epoch:03d}", exist_ok=True)
    json.dump({"skill": f"{p['method']} seed {p['seed']} epoch {epoch}"}, open(f"{run}/epoch_{epoch:03d}/skills.jsonl", "w"))
    open(f"{run}/epoch_{epoch:03d}/checkpoint", "w").write("weights")
"""
DVC_YAML = {
    "stages": {
        "rl": {
            "cmd": "python stage.py",
            "deps": ["stage.py"],
            "params": ["rl", "evaluate"],
            "outs": ["models/rl", {"runs/rl": {"persist": True}}],
            "metrics": [{"metrics/rl.json": {"cache": False}}],
            "plots": [{"metrics/rl_updates.json": {"cache": False}}],
        }
    }
}


def env() -> dict:
    return dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )


def sh(*cmd, cwd, ok=True, timeout=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def project(root: Path, ignore: str = "/models\n/runs\n") -> Path:
    """A committed git + DVC project with the real params.yaml and the one-stage pipeline above."""
    root.mkdir()
    sh("git", "init", "-q", cwd=root)
    sh("dvc", "init", "-q", cwd=root)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    (root / "stage.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    (root / ".gitignore").write_text(ignore)
    sh("git", "add", "-A", cwd=root)
    sh("git", "commit", "-qm", "init", cwd=root)
    return root


def seed_cli(*args, cwd) -> subprocess.CompletedProcess:
    # Read through a pipe, as `seed sweep | tee` is: a DVC queue worker that outlives the sweep must not keep the
    # pipe open (it did, and a CI run waited on it until it was cut off); the timeout turns such a hang into a failure.
    return sh(sys.executable, "-m", "seed_core.tools.cli", *args, cwd=cwd, ok=False, timeout=1200)


def test_recipe_expands_and_validates():
    combos = load_recipe(REPO / "recipes/sweeps/methods.yaml")
    assert [c.name for c in combos[:3]] == ["grpo-s0", "grpo-s1", "grpo-s2"] and len(combos) == 15
    nosft = {c.name: c for c in combos}["seed_nosft-s2"]
    assert nosft.overrides == {"rl.method": "seed", "rl.init": "warmup", "rl.seed": 2, "evaluate.seed": 2}
    check_combos(REPO, combos)  # every combination of the shipped recipe is valid params
    cut = load_recipe(REPO / "recipes/sweeps/methods.yaml", seeds=2, methods=["sdar", "grpo"])
    assert [c.name for c in cut] == ["sdar-s0", "sdar-s1", "grpo-s0", "grpo-s1"]
    with pytest.raises(ConfigError, match=r"unknown methods \['ppo'\]"):
        load_recipe(REPO / "recipes/sweeps/methods.yaml", methods=["ppo"])
    quick = load_recipe(REPO / "recipes/sweeps/quick.yaml")
    assert [c.name for c in quick] == ["grpo-s0", "grpo-s1", "seed-s0", "seed-s1"]
    assert quick[3].overrides == {
        "rl.epochs": 1,
        "evaluate.modes": ["greedy"],
        "evaluate.models": ["rl"],
        "rl.method": "seed",
        "rl.seed": 1,
        "evaluate.seed": 1,
    }
    check_combos(REPO, quick)


def test_overrides_round_trip():
    parsed = parse_set_params(["rl.method=grpo", "rl.seed=3", "evaluate.modes=[greedy]", "rl.lora_r=null"])
    assert parsed == {"rl.method": "grpo", "rl.seed": 3, "evaluate.modes": ["greedy"], "rl.lora_r": None}
    assert parse_set_params([format_override(k, v) for k, v in parsed.items()]) == parsed
    assert apply_overrides({"rl": {"seed": 0, "epochs": 2}}, {"rl.seed": 3}) == {"rl": {"seed": 3, "epochs": 2}}
    with pytest.raises(ConfigError, match="must be KEY=VALUE"):
        parse_set_params(["rl.method"])


def test_sweep_runs_collects_and_names_the_failed_run(tmp_path):
    root = project(tmp_path / "proj")
    (root / "recipe.yaml").write_text(
        yaml.safe_dump({"seeds": 2, "methods": {"grpo": {"rl.method": "grpo"}, "sdar": {"rl.method": "sdar"}}})
    )
    before = (root / "params.yaml").read_text()

    proc = seed_cli("sweep", "recipe.yaml", "--run", cwd=root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: 1 of 4 sweep runs did not succeed: sdar-s1" in proc.stderr

    summary = {s["name"]: s for s in json.loads((root / "results/sweep.json").read_text())}
    assert {n: s["status"] for n, s in summary.items()} == {
        "grpo-s0": "success",
        "grpo-s1": "success",
        "sdar-s0": "success",
        "sdar-s1": "failed",
    }
    assert "error: simulated stage failure for sdar seed 1" in summary["sdar-s1"]["error"]
    for name in ("grpo-s0", "grpo-s1", "sdar-s0"):
        method, seed = name.split("-s")
        out = root / "results" / name
        p = yaml.safe_load((out / "params.yaml").read_text())
        assert (p["rl"]["method"], p["rl"]["seed"], p["evaluate"]["seed"]) == (method, int(seed), int(seed))
        assert json.loads((out / "metrics/rl.json").read_text()) == {"method": method, "seed": int(seed)}
        assert json.loads((out / "metrics/rl_updates.json").read_text())[0]["rollout/success_rate"] == int(seed) / 10
        assert json.loads((out / "skills.jsonl").read_text()) == {"skill": f"{method} seed {seed} epoch 2"}
    assert not (root / "results/sdar-s1").exists()
    assert (root / "params.yaml").read_text() == before  # the workspace is untouched

    # collecting again reads the same experiments back
    again = seed_cli("sweep", "recipe.yaml", "--collect", cwd=root)
    assert again.returncode == 1 and "sdar-s1" in again.stderr
    assert json.loads((root / "results/sweep.json").read_text())[0]["rev"] == summary["grpo-s0"]["rev"]

    # running it again resumes: the three that succeeded are kept, and the cut-off one resumes from its checkpoint
    resumed = seed_cli("sweep", "recipe.yaml", "--run", cwd=root)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    kept = "kept 3 experiments already run on this commit with the same params: grpo-s0, grpo-s1, sdar-s0"
    assert kept in resumed.stdout and "running sdar-s1" in resumed.stdout and "running grpo" not in resumed.stdout
    assert "resuming runs/rl/sdar-grpo-s1-0123456789 after epoch_001" in resumed.stdout
    revs = {s["name"]: s.get("rev") for s in json.loads((root / "results/sweep.json").read_text())}
    assert all(revs[n] == summary[n]["rev"] for n in ("grpo-s0", "grpo-s1", "sdar-s0")) and revs["sdar-s1"]
    assert (root / "params.yaml").read_text() == before
    # with other params (here a recipe that changes rl.epochs) nothing is kept
    (root / "recipe.yaml").write_text(
        yaml.safe_dump({"seeds": 1, "set": {"rl.epochs": 3}, "methods": {"grpo": {"rl.method": "grpo"}}})
    )
    changed = seed_cli("sweep", "recipe.yaml", "--run", cwd=root)
    assert changed.returncode == 0 and "kept" not in changed.stdout and "running grpo-s0" in changed.stdout


@pytest.mark.fault("params", n=2)  # unknown method, outputs git-ignored
def test_sweep_refuses_bad_input_before_queueing(tmp_path):
    root = project(tmp_path / "proj")
    (root / "bad.yaml").write_text(yaml.safe_dump({"seeds": 1, "methods": {"ppo": {"rl.method": "ppo"}}}))
    proc = seed_cli("sweep", "bad.yaml", "--run", cwd=root)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: sweep run ppo-s0: params: `rl.method` must be one of ['grpo', 'seed', 'grpo_opsd', 'sdar', "
        "'seed_shuffled', 'seed_oracle'], got 'ppo'"
    )
    assert "ppo-s0" not in sh("dvc", "exp", "show", "--json", cwd=root).stdout

    ignored = project(tmp_path / "ignored", ignore="/models\n/runs\n/metrics\n")
    (ignored / "ok.yaml").write_text(yaml.safe_dump({"seeds": 1, "methods": {"grpo": {"rl.method": "grpo"}}}))
    proc = seed_cli("sweep", "ok.yaml", cwd=ignored)
    assert proc.returncode == 2 and "`metrics/` is git-ignored" in proc.stderr


def test_dvc_plots_render_rl_updates(tmp_path):
    """The plot definitions of the real dvc.yaml render from metrics/rl_updates.json and its timings."""
    root = tmp_path / "plots"
    root.mkdir()
    sh("git", "init", "-q", cwd=root)
    sh("dvc", "init", "-q", cwd=root)
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")  # dvc.yaml's foreach reads evaluate.models from it
    keys = [
        "rollout/success_rate",
        "rollout/invalid_rate",
        "opd/active_token_ratio",
        "opd/gate_mean",
        "opd/gate_gt_half_ratio",
        "skills/parse_rate",
        "loss/pg",
        "loss/kl",
        "loss/opd",
    ]
    (root / "metrics").mkdir()
    (root / "metrics/rl_updates.json").write_text(
        json.dumps([{"update": i, **{k: i / 10 for k in keys}} for i in range(3)])
    )
    (root / "metrics/time").mkdir()
    phases = ["time/rollout_s", "time/analysis_s", "time/rescore_s", "time/update_s"]
    (root / "metrics/time/rl_updates.json").write_text(
        json.dumps([{"update": i, **{k: float(i) for k in phases}} for i in range(3)])
    )
    plots = json.loads(sh("dvc", "plots", "show", "--json", cwd=root).stdout)["data"]
    assert {"success over updates", "OPD over updates", "losses over updates", "time per update"} <= set(plots)
    timed = plots["time per update"][0]["content"]["data"]["values"]
    assert {v["field"] for v in timed} == set(phases) and len(timed) == 12
    values = plots["success over updates"][0]["content"]["data"]["values"]
    assert {v["field"] for v in values} == {"rollout/success_rate", "rollout/invalid_rate"} and len(values) == 6


def test_dvc_push_pull_with_the_default_remote(tmp_path):
    """The repo's .dvc/config (default remote `local` = ../seed-dvc-remote) round-trips outputs."""
    root = project(tmp_path / "proj")
    shutil.copy(REPO / ".dvc/config", root / ".dvc/config")
    assert sh("dvc", "remote", "default", cwd=root).stdout.strip() == "local"
    sh("dvc", "repro", cwd=root)
    weights = (root / "models/rl/weights.bin").read_bytes()
    assert "pushed" in sh("dvc", "push", cwd=root).stdout
    assert any((tmp_path / "seed-dvc-remote" / "files" / "md5").rglob("*"))

    shutil.rmtree(root / ".dvc/cache")
    shutil.rmtree(root / "models")
    sh("dvc", "pull", cwd=root)
    assert (root / "models/rl/weights.bin").read_bytes() == weights


FAKE_STAGE = """\
import hashlib, os, pathlib, sys
name, outs, files = sys.argv[1], sys.argv[2].split(","), [f for f in sys.argv[3:] if f]
with open(os.environ["STAGES_LOG"], "a") as log:
    log.write(name + "\\n")
stamp = name + hashlib.sha256(open("params.yaml", "rb").read()).hexdigest()
for out in outs:
    path = pathlib.Path(out)
    if path.suffix:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"stamp": "%s"}' % stamp)
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "out.txt").write_text(stamp)
for f in files:  # files inside an output folder that other stages depend on
    pathlib.Path(f).write_text(stamp)
"""


def fake_pipeline(root: Path) -> None:
    """The real dvc.yaml, params.yaml and source deps, each stage's command replaced by one that logs the stage's
    name and writes its outputs (stamped with params.yaml's hash): DVC decides what runs exactly as it would."""
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    stages = {n: s.get("do", s) for n, s in spec["stages"].items()}
    deps = {d for s in stages.values() for d in s.get("deps", [])}
    for name, s in stages.items():
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in s.get("outs", []) + s.get("metrics", [])]
        inside = sorted(d for d in deps for o in outs if d.startswith(o + "/"))
        label = f"{name}@${{item}}" if "foreach" in spec["stages"][name] else name
        s["cmd"] = f"python fake_stage.py {label} {','.join(outs)} {' '.join(inside)}".strip()
    for d in deps:
        if (REPO / d).is_file():
            (root / d).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / d, root / d)
    (root / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "fake_stage.py").write_text(FAKE_STAGE)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")


def test_an_rl_side_sweep_runs_only_rl_and_its_evaluation(tmp_path):
    """Issue 34: an experiment that changes only RL-side parameters reuses every stage upstream of rl, in the
    workspace (one job) and in DVC's temporary copies (--jobs 2: restored from the run-cache)."""
    root = tmp_path / "proj"
    root.mkdir()
    sh("git", "init", "-q", cwd=root)
    sh("dvc", "init", "-q", cwd=root)
    fake_pipeline(root)
    log = tmp_path / "stages.log"
    os.environ["STAGES_LOG"] = str(log)  # the fake stages' log, outside the repository and its temporary copies
    try:
        sh("dvc", "repro", cwd=root)
        evaluate = [f"evaluate@{m}" for m in yaml.safe_load((REPO / "params.yaml").read_text())["evaluate"]["models"]]
        upstream = ["prepare", "warmup", "build_sft_data", "train_analyzer"]
        assert log.read_text().split() == [*upstream, "rl", *evaluate, "eval_table"]
        sh("git", "add", "-A", cwd=root)
        sh("git", "commit", "-qm", "the reference run", cwd=root)

        recipe = {"seeds": [1, 2], "set": {"evaluate.models": ["rl"]}, "methods": {"grpo": {"rl.method": "grpo"}}}
        (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
        log.write_text("")
        one = seed_cli("sweep", "recipe.yaml", "--seeds", "1", "--run", cwd=root)
        assert one.returncode == 0, one.stdout + one.stderr
        assert log.read_text().split() == ["rl", "evaluate@rl", "eval_table"]

        log.write_text("")
        both = seed_cli("sweep", "recipe.yaml", "--run", "--jobs", "2", cwd=root)
        assert both.returncode == 0, both.stdout + both.stderr
        assert "kept 1 experiments" in both.stdout and "queued grpo-s2" in both.stdout
        assert log.read_text().split() == ["rl", "evaluate@rl", "eval_table"]
    finally:
        del os.environ["STAGES_LOG"]


def test_run_queue_output_ends_with_the_command_not_with_what_it_left_running(tmp_path):
    """`dvc exp run --run-all` leaves processes holding its stdout (the forks behind its queue workers; one hung at
    shutdown kept a CI run waiting until it was cut off): `run_queue` relays the command's output, so whoever reads
    ours through a pipe gets EOF when the command is done, and nothing its leftovers print later."""
    fake = tmp_path / "dvc"  # prints, leaves a child holding its stdout that prints 20 s later, exits 3
    fake.write_text(
        f'#!/bin/sh\necho "ran the queue: $*"\n(sleep 20; echo late) &\necho $! > {tmp_path}/left\nexit 3\n'
    )
    fake.chmod(0o755)
    code = (
        "import sys; from pathlib import Path; from seed_core.tools import sweep\n"
        f"sweep._dvc_exe = lambda: {str(fake)!r}\n"
        f"sys.exit(sweep.run_queue(Path({str(tmp_path)!r}), jobs=2))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    subprocess.run(["pkill", "-P", (tmp_path / "left").read_text().strip()])  # the leftover's sleep
    assert proc.returncode == 3 and proc.stdout == "ran the queue: exp run --run-all --jobs 2\n", proc
