"""End to end through Prefect: a real local Prefect server (started here on 127.0.0.1, stopped by its PID),
`seed serve` serving prefect.yaml's deployments from a temp copy of the repo, and the pipeline deployment
run on the embedded default (real SmolLM2, real games, sizes cut to a few games and steps) to COMPLETED,
checked through the Prefect API; then the outputs, and a second plain `dvc repro` that finds nothing to do.

A fast test checks bad input on the same server: bad parameters and a failing stage end the deployment run
FAILED (not CRASHED) with the message the command line prints.
"""

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from repo_copy import BIN, REPO, STAGES, TINY, copy_repo, make_env, merge, run, stop

pytestmark = pytest.mark.e2e  # a Prefect server and deployments


@contextmanager
def serving(repo: Path, url: str, env: dict):
    """`seed serve` running in `repo` against the server (python -m: the copy's seed_core and flows are used)."""
    log = repo.parent / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seed_core.tools.cli", "serve"],
            cwd=repo,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env, PREFECT_API_URL=url, PREFECT_RUNNER_POLL_FREQUENCY="2"),
        )
    try:
        yield log
    finally:
        stop(proc)


def run_deployment(url: str, name: str, parameters: dict, timeout: float, log: Path):
    """Trigger a deployment run through the API and poll it to a final state; returns the flow run."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment as trigger
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        deadline = time.time() + 120
        while True:  # the deployment exists once `seed serve` has registered it
            try:
                flow_run = trigger(name, parameters=parameters, timeout=0)
                break
            except Exception:  # noqa: BLE001  (ObjectNotFound until registered)
                assert time.time() < deadline, f"deployment {name} never registered:\n{log.read_text()[-3000:]}"
                time.sleep(2)
        with get_client(sync_client=True) as client:
            deadline = time.time() + timeout
            while not (flow_run := client.read_flow_run(flow_run.id)).state.is_final():
                assert time.time() < deadline, f"{name} not finished after {timeout} s:\n{log.read_text()[-5000:]}"
                time.sleep(3)
    return flow_run


def flow_run_states(url: str, since: float) -> dict[str, list[str]]:
    """flow name -> final state types of its runs on the server created after `since` (other tests share it)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        names = {f.id: f.name for f in client.read_flows()}
        out: dict[str, list[str]] = {}
        for r in client.read_flow_runs():
            if r.created.timestamp() < since:
                continue
            out.setdefault(names[r.flow_id], []).append(r.state.type.value)
        return out


def test_pipeline_deployment_end_to_end(tmp_path, alfworld_root, prefect_server):
    work = tmp_path / "repo"
    env = make_env(ALFWORLD_DATA=str(alfworld_root))
    # the RL stage as 2 ranks under torchrun (FSDP2 over gloo, a vLLM engine per rank), started by its flow
    ranks = {"rl": {"launcher": "torchrun", "world_size": 2, "games_per_update": 2}}
    copy_repo(work, merge(merge(yaml.safe_load((REPO / "params.yaml").read_text()), TINY), ranks), env)

    started = time.time()
    with serving(work, prefect_server, env) as log:
        flow_run = run_deployment(prefect_server, "seed-pipeline/pipeline", {}, timeout=3600, log=log)
        out = log.read_text()
    assert flow_run.state.type.value == "COMPLETED", f"{flow_run.state}\n{out[-8000:]}"
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    states = flow_run_states(prefect_server, since=started)
    flows = [stage.split("@")[0] for stage in STAGES]  # evaluate@<model> stages all run the evaluate flow
    for name in set(flows):  # each stage ran as its own flow, reported to the same server
        assert states.get(name) == ["COMPLETED"] * flows.count(name), (name, states)

    results = json.loads((work / "metrics/eval.json").read_text())
    assert set(results) == {"base", "warmup", "rl"}
    for name, model in results.items():
        for split in ("valid_seen", "valid_unseen"):
            m = model[split]["greedy"]
            lines = (work / "data/eval" / name / split / "greedy-s0.jsonl").read_text().splitlines()
            won = [json.loads(line)["won"] for line in lines]
            assert m["episodes"] == len(won) == 1 and m["success/micro"] == m["success/macro"] == sum(won) / len(won)
    table = (work / "metrics/eval.md").read_text()
    assert "macro avg" in table and "| warmup | valid_unseen | greedy |" in table
    assert (work / "models/rl/model.safetensors").exists()
    (run_dir,) = (work / "runs/rl").iterdir()
    assert (run_dir / "epoch_001" / "skills.jsonl").exists() and (
        run_dir / "epoch_001" / "trainable.safetensors"
    ).exists()
    assert json.loads((work / "metrics/rl.json").read_text())["updates"] == 1
    # timings stay out of the hashed results (the README's "Did I get what you got?")
    for name in ("warmup", "sft_data", "train_analyzer", "rl_updates", "rl"):
        data = json.loads((work / f"metrics/{name}.json").read_text())
        keys = [k for row in (data if isinstance(data, list) else [data]) for k in row]
        assert not [k for k in keys if "time/" in k or "memory/" in k], name
    assert {"time/replay_s", "sft/time/train_s"} <= set(json.loads((work / "metrics/time/warmup.json").read_text()))
    assert {"update", "time/update_s", "memory/peak_rss_mb"} <= set(
        json.loads((work / "metrics/time/rl_updates.json").read_text())[0]
    )
    assert "time/update_s" in json.loads((run_dir / "epoch_001" / "timing.json").read_text())[0]

    again = run([str(BIN / "dvc"), "repro"], work, env).stdout
    assert "Running stage" not in again
    assert "Data and pipelines are up to date" in again

    # the evaluation is cached per model: a change that reaches only the RL stage (RL from the warmed-up model,
    # the w/o-SFT ablation) makes only the RL stage stale, and re-scores models/rl alone. A dry run lists what
    # would run without running it; --force-downstream, as it cannot know whether the new weights differ.
    (work / "params.yaml").write_text(
        yaml.safe_dump(merge(yaml.safe_load((work / "params.yaml").read_text()), {"rl": {"init": "warmup"}}))
    )
    status = run([str(BIN / "dvc"), "status", "--json"], work, env).stdout
    assert json.loads(status) == {"rl": [{"changed deps": {"params.yaml": {"rl": "modified"}}}]}, status
    dry = run([str(BIN / "dvc"), "repro", "--dry", "--force-downstream"], work, env).stdout
    ran = [line.split("'")[1] for line in dry.splitlines() if line.startswith("Running stage")]
    assert ran == ["rl", "evaluate@rl", "eval_table"]


def test_deployment_bad_input_fails_not_crashes(tmp_path, prefect_server):
    """Bad overrides, a bad params file and a failing stage: each deployment run is FAILED with the CLI's message."""
    work = tmp_path / "repo"
    env = make_env()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    copy_repo(work, params, env)

    def cli_error(*args) -> str:
        proc = run(
            [sys.executable, "-m", "seed_core.tools.cli", *args],
            work,
            dict(env, PREFECT_API_URL=prefect_server),
            ok=False,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        return line.removeprefix("error: ")

    with serving(work, prefect_server, env) as log:
        # an override that does not validate: refused before DVC starts, same text as `seed run -S ...`
        expected = cli_error("run", "-S", "rl.method=nope")
        assert "`rl.method` must be one of" in expected
        fr = run_deployment(prefect_server, "seed-pipeline/pipeline", {"set_params": ["rl.method=nope"]}, 120, log)
        assert fr.state.type.value == "FAILED" and fr.state.message.endswith(expected), fr.state

        # a params file with an unknown key: same text as `seed params`
        (work / "params.yaml").write_text(yaml.safe_dump(merge(params, {"rl": {"methd": "grpo"}})))
        expected = cli_error("params")
        assert "unknown key `rl.methd`" in expected
        fr = run_deployment(prefect_server, "seed-pipeline/pipeline", {}, 120, log)
        assert fr.state.type.value == "FAILED" and fr.state.message.endswith(expected), fr.state

        # valid params, but the stage fails (no games there): DVC's exit code fails the flow with the stage's error
        (work / "params.yaml").write_text(
            yaml.safe_dump(merge(params, {"data": {"alfworld_data": str(tmp_path / "none")}}))
        )
        fr = run_deployment(prefect_server, "seed-pipeline/pipeline", {"target": "prepare"}, 300, log)
        assert fr.state.type.value == "FAILED", fr.state
        assert f"error: no ALFWorld data in {tmp_path / 'none'}" in fr.state.message
        assert "failed to reproduce 'prepare'" in fr.state.message
