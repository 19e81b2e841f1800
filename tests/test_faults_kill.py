"""Kill -9 of `dvc repro` inside each stage, and a planted API key that must appear in no file a run writes.

Two temp copies of the repo run the whole pipeline on the same small params (the tiny random-init model, a
few real games, two RL epochs, the `openai` teacher served by a real local HTTP server that checks the key):
one uninterrupted, one whose `dvc repro` process group is sent SIGKILL in the middle of build_sft_data
(while the teacher is answering), train_analyzer (while training), the RL stage's second epoch, and
evaluate@warmup (after evaluate@base finished), and restarted with `dvc repro` each time. After every kill no
output is partial; each restart skips the stages that finished; the finished RL epoch is never recomputed;
and the final weights, skill corpora, datasets and metrics equal the uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open

from faultsuite import files_containing, scan_for_secret
from helpers import chat_endpoint, chat_reply, reply
from repo_copy import BIN, REPO, STAGES, TINY, copy_repo, make_env, merge

pytestmark = pytest.mark.e2e  # dvc repro chains killed with -9

KEY_ENV = "SEED_TEACHER_API_KEY"
KEY = "sk-planted-" + hashlib.sha256(b"seed fault suite").hexdigest()[:24]

# Values that measure the machine or the bill, not the result: they differ between any two runs (time,
# memory) or because a restarted run was answered from the teacher cache instead of the endpoint.
VOLATILE = re.compile(
    r"seconds|_s$|/s$|time|runtime|rss|memory|per_second|teacher/(requests|retries|failures|cache|calls|billed)"
)


class SkillServer:
    """A chat-completions endpoint on 127.0.0.1 that answers every analyzer prompt with a skill derived from
    the prompt (deterministic), and refuses requests without the planted key."""

    def __init__(self):
        self.requests = 0

    def handle(self, h, body: dict) -> None:
        if h.headers.get("Authorization") != f"Bearer {KEY}":
            return reply(h, 401, {"error": "bad key"})
        self.requests += 1
        tag = hashlib.sha256(body["messages"][-1]["content"].encode()).hexdigest()[:8]
        skill = {"summary": f"episode {tag}", "episode_skill": f"Check each countertop before the cabinets ({tag})."}
        reply(h, 200, chat_reply(json.dumps(skill), 100, 20))


@pytest.fixture(scope="module")
def skill_server():
    server = SkillServer()
    with chat_endpoint(server.handle) as url:
        server.url = url
        yield server


def repro(work: Path, env: dict, log: Path, kill_when=None, pause_s: float = 0.0) -> tuple[int, str]:
    """`dvc repro` in `work`, output appended to `log`. `kill_when(output so far)`: once it returns True (and
    `pause_s` later), SIGKILL the whole process group (dvc and the stage's python). Returns (exit code, output)."""
    proc = subprocess.Popen(
        [str(BIN / "dvc"), "repro"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def read():  # drains the pipe all along, so the stage never blocks on its output
        with open(log, "a") as out:
            for line in proc.stdout:
                lines.append(line)
                out.write(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if kill_when is not None:
        while proc.poll() is None and not kill_when("".join(lines)):
            time.sleep(0.05)
        if proc.poll() is None:
            time.sleep(pause_s)
            os.killpg(proc.pid, signal.SIGKILL)
    rc = proc.wait()
    reader.join()
    return rc, "".join(lines)


def stages_run(output: str) -> list[str]:
    return re.findall(r"Running stage '([\w@]+)'", output)


def assert_no_partial_outputs(work: Path) -> None:
    """Every output file that exists is whole: JSON parses, safetensors open. (Temp files and folders, named
    `.<name>...tmp`, may survive a kill; nothing reads them and the next write replaces them.)"""
    for top in ("models", "data", "metrics", "runs"):
        for p in (work / top).rglob("*") if (work / top).exists() else ():
            if not p.is_file() or any(part.endswith(".tmp") for part in p.relative_to(work).parts):
                continue
            if p.suffix == ".json":
                json.loads(p.read_text())
            elif p.suffix == ".jsonl":
                [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            elif p.suffix == ".safetensors":
                tensors(p)


def tensors(path: Path) -> dict:
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def normalized(obj):
    if isinstance(obj, dict):
        return {k: normalized(v) for k, v in obj.items() if not VOLATILE.search(k)}
    if isinstance(obj, list):
        return [normalized(v) for v in obj]
    return obj


def results(work: Path) -> dict[str, object]:
    """What a run produced, minus what measures the machine: metrics, skill corpora, SFT preview, episodes."""
    out: dict[str, object] = {}
    for p in sorted((work / "metrics").glob("*.json")):
        if p.name.endswith(".lineage.json"):  # provenance (flow run id, time), not a result
            continue
        out[str(p.relative_to(work))] = normalized(json.loads(p.read_text()))
    for p in sorted([*(work / "runs").rglob("*.jsonl"), *(work / "data").rglob("*.jsonl")]):
        out[str(p.relative_to(work))] = [
            normalized(json.loads(line)) for line in p.read_text().splitlines() if line.strip()
        ]
    return out


@pytest.mark.fault("kill", n=4)
@pytest.mark.fault("security", n=1)
def test_kill_9_in_each_stage_then_repro_equals_an_uninterrupted_run(
    tmp_path, tmp_path_factory, alfworld_root, tiny_model_dir, skill_server, prefect_server
):
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), TINY)
    params = merge(
        params,
        {
            "model": {"name_or_path": str(tiny_model_dir)},
            # what this test checks (atomic outputs, resume, no leak) does not depend on the sampler, and the HF
            # backend spares each of the ~16 stage starts a vLLM engine (test_vllm resumes the RL stage on vLLM)
            "rollout": {"backend": "hf"},
            "evaluate": {"generation": {"backend": "hf"}},
            "rl": {"epochs": 2},
            "teacher": {
                "kind": "openai",
                "base_url": skill_server.url,
                "model": "fake-glm",
                "api_key_env": KEY_ENV,
                "timeout_s": 30,
                "concurrency": 1,
            },
        },
    )
    env = make_env(
        ALFWORLD_DATA=str(alfworld_root), PREFECT_API_URL=prefect_server, WANDB_MODE="offline", **{KEY_ENV: KEY}
    )
    runs = {}
    for name in ("reference", "killed"):
        runs[name] = tmp_path / name
        runs[name].mkdir()
        copy_repo(runs[name], params, dict(env, WANDB_DIR=str(runs[name] / "wandb")))
    logs = tmp_path / "logs"
    logs.mkdir()

    ref = runs["reference"]
    rc, out = repro(ref, dict(env, WANDB_DIR=str(ref / "wandb")), logs / "reference.log")
    assert rc == 0, out[-5000:]
    assert stages_run(out) == list(STAGES)
    assert skill_server.requests > 0

    work = runs["killed"]
    env = dict(env, WANDB_DIR=str(work / "wandb"))
    (run_dir,) = [p.name for p in (ref / "runs/rl").iterdir() if p.is_dir()]
    epoch1 = work / "runs/rl" / run_dir / "epoch_001"
    answered = skill_server.requests
    kills = [  # (stage, when to kill: a condition on the output so far, seconds to wait after it holds)
        # labelling: the endpoint has answered one of this run's prompts (the reference run asked `answered`)
        (
            "build_sft_data",
            lambda out: "Running stage 'build_sft_data'" in out and skill_server.requests > answered,
            0.5,
        ),
        ("train_analyzer", lambda out: "analyzer check (before)" in out, 3),
        ("rl", lambda out: "epoch 2 update" in out, 0),
        ("evaluate@warmup", lambda out: "rollout eval/warmup" in out, 0),
    ]
    finished: list[str] = []
    for stage, when, pause_s in kills:
        rc, out = repro(work, env, logs / "killed.log", kill_when=when, pause_s=pause_s)
        assert rc == -signal.SIGKILL, f"not killed in {stage}:\n{out[-3000:]}"
        ran = stages_run(out)
        assert ran[-1] == stage and not set(ran[:-1]) & set(finished), (stage, ran, finished)  # finished stages skipped
        finished += ran[:-1]
        assert_no_partial_outputs(work)
        if stage == "build_sft_data":
            at_kill = skill_server.requests
        if stage == "rl":
            assert epoch1.is_dir() and not (epoch1.parent / "epoch_002").exists()
            epoch1_files = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in epoch1.iterdir()}
    rc, out = repro(work, env, logs / "killed.log")
    assert rc == 0, out[-5000:]
    assert stages_run(out) == ["evaluate@warmup", "evaluate@rl", "eval_table"]
    assert sorted(finished + stages_run(out)) == sorted(STAGES)
    # the epoch finished before the kill was loaded, not recomputed: same files, never rewritten
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in epoch1.iterdir()} == epoch1_files
    assert "resuming after epoch_001" in (logs / "killed.log").read_text()

    # the killed-and-restarted run ends where the uninterrupted one did
    weights = [
        Path("models/rl/model.safetensors"),
        Path(f"runs/rl/{run_dir}/epoch_002/trainable.safetensors"),
        Path("models/analyzer/model.safetensors"),
        Path("models/warmup/model.safetensors"),
    ]
    for rel in weights:
        a, b = tensors(ref / rel), tensors(work / rel)
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), f"{rel} differs from the uninterrupted run"
    ref_results, got = results(ref), results(work)
    assert ref_results.keys() == got.keys()
    differ = [k for k in ref_results if got[k] != ref_results[k]]
    assert not differ, (
        f"{differ} differ from the uninterrupted run; the first: {got[differ[0]]} != {ref_results[differ[0]]}"
    )
    # the restart asked the endpoint only for what the cache did not hold yet
    assert skill_server.requests - at_kill < answered

    # the key reached the endpoint (else the run would have failed) and no file any run wrote: repos (logs,
    # params dumps, metrics, dvc.lock and cache, W&B offline runs, lineage files), the Prefect server's
    # database and every other temp folder of this test session
    control = tmp_path / "control"
    control.mkdir()
    (control / "planted.txt").write_text(f"key={KEY}\n")
    assert files_containing(KEY, control) == [str(control / "planted.txt")]  # the scan does find a written key
    (control / "planted.txt").unlink()
    leaks = scan_for_secret(KEY, tmp_path_factory.getbasetemp(), Path(os.environ["PREFECT_HOME"]).parent)
    assert leaks == [], f"the API key was written to {leaks}"
