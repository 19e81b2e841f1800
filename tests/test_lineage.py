"""Lineage: a real three-stage DVC project in a temp folder (git init, dvc init, `dvc repro`), whose stages write
their outputs and call the same metadata writer as the flows; `seed lineage` must walk the whole chain."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from seed_core.tools import cli
from seed_core.tools.lineage import (
    LineageError,
    describe_code,
    describe_machine,
    git_revision,
    metadata_path,
    render_text,
    select_params,
    trace,
    write_lineage,
)

pytestmark = pytest.mark.e2e  # a DVC repo

REPO = Path(__file__).resolve().parents[1]
GAMES = [
    {"game_id": "train/pick-1/trial_a", "split": "train", "task_type": "pick", "sha256": "a" * 64},
    {"game_id": "train/heat-2/trial_b", "split": "train", "task_type": "heat", "sha256": "b" * 64},
]

STAGE_PY = f"""
import json, sys, yaml
from pathlib import Path
from seed_core.tools.lineage import select_params, write_lineage

stage, params = sys.argv[1], yaml.safe_load(open("params.yaml"))
if stage == "prepare":
    Path("data/manifests").mkdir(parents=True, exist_ok=True)
    Path("data/manifests/train.json").write_text(json.dumps({{"games": {GAMES!r}}}))
    Path("models/base").mkdir(parents=True, exist_ok=True)
    Path("models/base/weights.bin").write_text("base %s" % params["model"]["size"])
    write_lineage(stage, ["models/base", "data/manifests"], select_params(params, ["model", "prepare"]),
                  inputs={{"alfworld_data": "/data/alfworld"}})
elif stage == "train":
    Path("models/rl").mkdir(parents=True, exist_ok=True)
    Path("models/rl/weights.bin").write_text(Path("models/base/weights.bin").read_text() + " trained")
    Path("metrics").mkdir(exist_ok=True)
    Path("metrics/train.json").write_text(json.dumps({{"loss": 0.5}}))
    write_lineage(stage, ["models/rl", "metrics/train.json"], select_params(params, ["train", "model.size"]))
else:
    Path("metrics/eval.json").write_text(json.dumps({{"success": 0.25}}))
    write_lineage(stage, ["metrics/eval.json"], select_params(params, ["evaluate"]), flow_run_id="run-123")
"""

DVC_YAML = """
stages:
  prepare:
    cmd: {py} stage.py prepare
    deps: [stage.py]
    params: [model, prepare]
    outs: [models/base, data/manifests]
  train:
    cmd: {py} stage.py train
    deps: [stage.py, models/base, data/manifests/train.json]
    params: [train, model.size]
    outs:
      - models/rl
      - metrics/train.json:
          cache: false
  evaluate:
    cmd: {py} stage.py evaluate
    deps: [models/rl, data/manifests]
    params: [evaluate]
    metrics:
      - metrics/eval.json:
          cache: false
"""


def sh(cmd, cwd, env):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("dvcproj")
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        DVC_NO_ANALYTICS="1",
        DVC_SITE_CACHE_DIR=str(root / ".site-cache"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    (root / "stage.py").write_text(STAGE_PY)
    (root / "dvc.yaml").write_text(DVC_YAML.format(py=sys.executable))
    (root / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {"size": 3, "name": "tiny"},
                "prepare": {"seed": 0},
                "train": {"lr": 0.1, "seed": 1},
                "evaluate": {"games": 2},
            }
        )
    )
    (root / ".gitignore").write_text(".site-cache/\n")
    dvc = [sys.executable, "-m", "dvc"]
    sh(["git", "init", "-q"], root, env)
    sh(dvc + ["init", "-q"], root, env)
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "pipeline"], root, env)
    sh(dvc + ["repro"], root, env)
    head = sh(["git", "rev-parse", "HEAD"], root, env).strip()
    return root, env, head


def lock(root):
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


def test_chain_from_a_file_inside_a_folder_output(project):
    root, _, head = project
    tree = trace(root / "models/rl/weights.bin")
    node = tree["node"]
    assert tree["path"] == "models/rl/weights.bin"
    assert (node["stage"], node["via"]) == ("train", "models/rl")
    assert node["cmd"].endswith("stage.py train")
    assert node["params"] == {"train.lr": 0.1, "train.seed": 1, "model.size": 3}
    deps = {d["path"]: d for d in node["deps"]}
    prepare_outs = {o["path"]: o["md5"] for o in lock(root)["prepare"]["outs"]}
    assert deps["models/base"]["hash"] == prepare_outs["models/base"] and deps["models/base"]["producer"] == "prepare"
    assert deps["data/manifests/train.json"]["producer"] == "prepare"  # a file inside prepare's folder output
    assert deps["stage.py"]["producer"] is None
    assert node["meta"]["git"] == {
        "commit": head,
        "dirty": False,
        "changed": [],
    }  # dvc.lock/.gitignore edits don't count
    assert node["meta"]["params"] == {"train": {"lr": 0.1, "seed": 1}, "model.size": 3}
    assert node["notes"] == []
    # upstream: prepare, once (both deps lead there), down to the external inputs and the game hashes
    assert [u["stage"] for u in node["upstream"]] == ["prepare"]
    prep = node["upstream"][0]
    assert prep["params"] == {"model.size": 3, "model.name": "tiny", "prepare.seed": 0}
    assert prep["meta"]["inputs"] == {"alfworld_data": "/data/alfworld"}
    digest = hashlib.sha256("".join(f"{g['game_id']}:{g['sha256']}\n" for g in GAMES).encode()).hexdigest()
    assert prep["manifests"] == [
        {"output": "data/manifests", "manifest": "train.json", "games": 2, "splits": ["train"], "games_sha256": digest}
    ]

    text = render_text(tree)
    assert "models/rl  <-  stage train" in text
    assert f"code: {head} (clean)" in text and f"torch {torch.__version__} on " in text  # the machine line
    assert "models/base  md5 " + prepare_outs["models/base"] + "  <- prepare" in text
    assert "alfworld_data: /data/alfworld" in text
    assert f"2 games (train), game files sha256 digest {digest[:16]}" in text


def test_metrics_file_walks_three_stages_and_cli_formats(project, tmp_path, capsys, monkeypatch):
    root, _, _ = project
    monkeypatch.chdir(root)
    cli.main(["lineage", "metrics/eval.json"])
    out = capsys.readouterr().out
    # depth first in dvc.lock's (sorted) dependency order: prepare via data/manifests, then train, whose own
    # upstream prepare is not repeated
    assert (
        out.index("<-  stage evaluate")
        < out.index("└── data/manifests  <-  stage prepare\n")
        < out.index("└── models/rl  <-  stage train")
    )
    assert out.count("cmd: ") == 3 and out.rstrip().endswith("└── data/manifests  <-  stage prepare  (shown above)")
    assert "Prefect flow run run-123" in out and "evaluate.games: 2" in out

    md = tmp_path / "lineage.md"
    cli.main(["lineage", "metrics/eval.json", "--format", "md", "--out", str(md)])
    text = md.read_text()
    assert text.startswith("# Lineage of `metrics/eval.json`")
    assert "### `models/rl` ← stage `train`" in text and "| `train.lr` | `0.1` |" in text
    page = tmp_path / "lineage.html"
    cli.main(["lineage", "metrics/eval.json", "--format", "html", "--out", str(page)])
    html = page.read_text()
    assert html.count("<details open class='stage'") == 3 and "data-stage='prepare'" in html


def test_path_no_stage_produced_is_refused_with_the_outputs(project, capsys, monkeypatch):
    root, _, _ = project
    with pytest.raises(LineageError) as e:
        trace(root / "stage.py")
    msg = str(e.value)
    assert msg.startswith(f"no stage in {root / 'dvc.lock'} produced stage.py\noutputs by stage:\n")
    assert "  prepare: data/manifests, models/base\n" in msg and msg.endswith("  evaluate: metrics/eval.json")
    dvc_yaml = root / "dvc.yaml"
    saved = dvc_yaml.read_text()
    dvc_yaml.write_text(saved + "  report:\n    cmd: echo\n    outs: [report.html]\n")
    try:
        with pytest.raises(LineageError) as e:
            trace(root / "report.html")
    finally:
        dvc_yaml.write_text(saved)
    assert str(e.value).startswith(
        "stage report declares report.html in dvc.yaml but has not run yet (`dvc repro report`)"
    )
    assert str(e.value).endswith("  report (not run yet): report.html")
    monkeypatch.chdir(root)
    with pytest.raises(SystemExit) as ex:
        cli.main(["lineage", "params.yaml"])
    assert ex.value.code == 2 and "produced params.yaml" in capsys.readouterr().err


def test_notes_missing_metadata_and_a_run_folder_made_under_other_params(project):
    root, env, _ = project
    run = root / "models/rl/run-a"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"params": {"train": {"lr": 0.5, "seed": 1}}}))
    (run / "w.bin").write_text("x")
    # without metadata for any of prepare's outputs (another output's file would stand in for a missing one)
    metas = [root / metadata_path(o) for o in ("models/base", "data/manifests")]
    saved = [m.read_text() for m in metas]
    for m in metas:
        m.unlink()
    try:
        node = trace(run / "w.bin")["node"]
        assert node["notes"][0].startswith("models/rl/run-a was trained under other parameters")
        assert "train.lr: 0.5 here, 0.1 in dvc.lock" in node["notes"][0]
        prep = node["upstream"][0]
        assert prep["meta"] is None
        # dvc.lock was never committed in this project, so there is no commit to fall back to
        assert prep["notes"] == [
            "no metadata file data/manifests.lineage.json (outputs restored by dvc pull/checkout/exp apply have none)"
        ]
        subprocess.run(["git", "add", "dvc.lock"], cwd=root, check=True, env=env)
        subprocess.run(["git", "commit", "-qm", "lock"], cwd=root, check=True, env=env)
        lock_commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        note = trace(run / "w.bin")["node"]["upstream"][0]["notes"][0]
        subprocess.run(["git", "reset", "-q", "--soft", "HEAD~1"], cwd=root, check=True)
        assert note.endswith(f"; dvc.lock was last committed in {lock_commit}")
    finally:
        for m, text in zip(metas, saved):
            m.write_text(text)
        (run / "run.json").unlink()
        (run / "w.bin").unlink()
        run.rmdir()


def test_git_revision_lists_uncommitted_code(project):
    root, _, head = project
    (root / "stage.py").write_text((root / "stage.py").read_text() + "\n# edited\n")
    try:
        rev = git_revision(root)
        assert rev == {"commit": head, "dirty": True, "changed": ["stage.py"]}
    finally:
        subprocess.run(["git", "checkout", "-q", "stage.py"], cwd=root, check=True)
    assert git_revision(root.parent)["commit"] is None  # not a repository: said, not raised


def test_select_params_dotted_keys_and_unknown_key():
    resolved = {"model": {"dtype": "auto", "name": "x"}, "rl": {"seed": 0}}
    assert select_params(resolved, ["rl", "model.dtype"]) == {"rl": {"seed": 0}, "model.dtype": "auto"}
    with pytest.raises(LineageError, match="'model.nope' is not in the resolved parameters"):
        select_params(resolved, ["model.nope"])


def test_write_lineage_names_the_dvc_experiment(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "b" * 40)
    monkeypatch.setenv("DVC_EXP_NAME", "seed-s1")
    (path,) = write_lineage("rl", ["model"], {"rl.seed": 1}, cwd=tmp_path)
    assert path == tmp_path / "model.lineage.json"
    meta = json.loads(path.read_text())
    assert meta["dvc_experiment"] == {"name": "seed-s1", "baseline_rev": "b" * 40} and meta["git"]["commit"] is None
    assert describe_code(meta).endswith(f", DVC experiment seed-s1 on baseline {'b' * 40}")


def test_write_lineage_records_the_machine(tmp_path):
    """What can change floats under the same code: CPU flags (bf16 for `model.dtype: auto`), threads, versions."""
    (tmp_path / "out").mkdir()
    (path,) = write_lineage("s", ["out"], {}, cwd=tmp_path)
    m = json.loads(path.read_text())["machine"]
    assert m["versions"]["torch"] == torch.__version__ and m["torch_threads"] == torch.get_num_threads()
    assert m["cpu_count"] == os.cpu_count() and m["gpu"] is None
    flags = Path("/proc/cpuinfo").read_text().split("\nflags")[1].split("\n")[0].split()
    assert m["cpu_flags"] == [
        f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags
    ]
    assert m["cpu_auto_dtype"] in ("float32", "bfloat16") and f"dtype auto: {m['cpu_auto_dtype']})" in describe_machine(
        {"machine": m}
    )
    assert describe_machine({"machine": m}).endswith(f"torch {torch.__version__} on {torch.get_num_threads()} threads")
    assert describe_machine({"time": "t"}) == "not recorded"  # written before machines were recorded


def test_record_stage_in_a_prefect_flow_records_the_flow_run(tmp_path):
    """The flows' helper: resolved params with defaults, and the id of the Prefect flow run it ran in. In a
    subprocess: Prefect's temporary server logs to a closed stream when it stops at pytest's exit."""
    (tmp_path / "params.yaml").write_text("rl:\n  method: grpo\n")
    (tmp_path / "out").mkdir()
    script = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(REPO / "flows")!r})
        from _common import record_stage
        from prefect import flow
        from prefect.runtime import flow_run

        @flow(name="lineage-test")
        def stage() -> str:
            record_stage("rl", ["out", "missing.json"], "params.yaml", inputs={{"run_dir": "runs/rl/x"}})
            return flow_run.id

        print("RUN", stage())
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = proc.stdout.split("RUN ")[-1].strip()
    meta = json.loads((tmp_path / "out.lineage.json").read_text())
    assert meta["prefect_flow_run_id"] == run_id and len(run_id) == 36
    assert meta["params"]["rl"]["method"] == "grpo" and meta["params"]["rl"]["epochs"] == 2  # a default, resolved
    assert meta["params"]["model.dtype"] == "auto"
    # exactly the params dvc.yaml tracks for the stage, read from dvc.yaml (no hand-kept copy)
    assert sorted(meta["params"]) == sorted(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["rl"]["params"])
    assert meta["inputs"] == {"run_dir": "runs/rl/x"} and meta["outputs"] == ["out", "missing.json"]
    assert not (tmp_path / "missing.json.lineage.json").exists()
