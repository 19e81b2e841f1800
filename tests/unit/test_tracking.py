"""W&B tracking: an offline run writes its files, carries the params as config, and never stores a secret."""

import os
from pathlib import Path

import pytest
import yaml

from seed_core.config import load_params, to_dict
from seed_core.tracking import REDACTED, Tracker, artifact_name, dvc_outputs, scrub, wandb_mode

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-PLANTED-a1b2c3d4e5"
LOCK = {
    "schema": "2.0",
    "stages": {
        "rl": {
            "cmd": "python flows/rl.py",
            "deps": [{"path": "models/analyzer", "hash": "md5", "md5": "11111111111111111111111111111111.dir"}],
            "outs": [
                {
                    "path": "models/rl",
                    "hash": "md5",
                    "md5": "22222222222222222222222222222222.dir",
                    "size": 9,
                    "nfiles": 1,
                }
            ],
        }
    },
}


def flush() -> None:
    """W&B's service writes the offline run file asynchronously, after `finish` returns; stopping it flushes."""
    import wandb

    wandb.teardown()


@pytest.fixture
def wandb_dirs(tmp_path, monkeypatch):
    """Offline W&B with every folder it writes (run files, artifact staging, cache, settings) under tmp_path."""
    dirs = {v: tmp_path / v.lower() for v in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR")}
    for var, d in dirs.items():
        d.mkdir()
        monkeypatch.setenv(var, str(d))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("SEED_PIPELINE_RUN", "pipeline-test")
    yield dirs
    flush()


def test_scrub_drops_credential_keys_and_redacts_values():
    cfg = {
        "teacher": {"api_key_env": "X_KEY_NAME", "base_url": f"http://h/?k={SECRET}"},
        "hf_token": "t",
        "rl": {"max_new_tokens": 3, "micro_batch_tokens": 5},
        "password": "p",
        "list": [SECRET],
    }
    assert scrub(cfg, [SECRET]) == {
        "teacher": {"api_key_env": "X_KEY_NAME", "base_url": f"http://h/?k={REDACTED}"},
        "rl": {"max_new_tokens": 3, "micro_batch_tokens": 5},
        "list": [REDACTED],
    }


def test_mode_offline_unless_configured(monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"


@pytest.mark.e2e  # an offline W&B run starts its wandb-core service process
def test_offline_run_has_params_skills_and_dvc_refs_but_no_secret(tmp_path, wandb_dirs, monkeypatch):
    # the teacher's key lives in the variable teacher.api_key_env names, and leaked into a params string
    monkeypatch.setenv("MY_TEACHER_CREDENTIAL", SECRET)
    params = to_dict(load_params(REPO / "params.yaml"))
    params["teacher"] = {
        **params["teacher"],
        "api_key_env": "MY_TEACHER_CREDENTIAL",
        "base_url": f"https://api/{SECRET}/v1",
    }
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(LOCK))
    (tmp_path / "models/rl").mkdir(parents=True)
    (tmp_path / "models/rl/model.safetensors").write_bytes(b"\0" * 4096)

    tracker = Tracker("rl", params)
    assert tracker.run.config["rl"]["method"] == params["rl"]["method"]
    assert tracker.run.config["rl"]["micro_batch_tokens"] == params["rl"]["micro_batch_tokens"]
    assert tracker.run.config["teacher"]["base_url"] == f"https://api/{REDACTED}/v1"
    assert tracker.run.group == "pipeline-test" and tracker.run.job_type == "rl"
    tracker.log({"rollout/success_rate": 0.5, "loss/pg": 0.1}, step=0)
    tracker.log_skills(
        [
            {
                "update": 0,
                "task_type": "pick",
                "outcome": "failure",
                "skill": f"never say {SECRET}",
                "rescore": {"delta_mean": 0.3},
                "trajectory": {"won": False},
            }
        ],
        step=0,
    )
    assert tracker.log_dvc_outputs(tmp_path / "dvc.lock") == [artifact_name("models/rl")] == ["dvc-models-rl"]
    run_dir = Path(tracker.run.dir).parent
    tracker.finish()
    flush()

    assert run_dir.parent == wandb_dirs["WANDB_DIR"] / "wandb" and run_dir.name.startswith("offline-run-")
    (table,) = run_dir.rglob("*.table.json")
    assert f"never say {REDACTED}" in table.read_text()
    (binary,) = run_dir.glob("run-*.wandb")
    data = binary.read_bytes()
    assert b"micro_batch_tokens" in data and b"rollout/success_rate" in data
    assert b"22222222222222222222222222222222.dir" in data  # the artifact carries the DVC hash...
    assert (tmp_path / "models/rl").as_uri().encode() in data  # ...and references the checkpoint...
    assert b"\0" * 4096 not in data  # ...instead of uploading it
    for d in wandb_dirs.values():
        for f in d.rglob("*"):
            assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f"secret found in {f}"


def test_dvc_outputs_from_lock(tmp_path):
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(LOCK))
    (entry,) = dvc_outputs(tmp_path / "dvc.lock")
    assert entry == {
        "path": "models/rl",
        "md5": "22222222222222222222222222222222.dir",
        "size": 9,
        "nfiles": 1,
        "stage": "rl",
        "deps": {"models/analyzer": "11111111111111111111111111111111.dir"},
    }
    assert dvc_outputs(tmp_path / "dvc.lock", stages=["evaluate"]) == []


def test_disabled_is_a_no_op(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    t = Tracker("rl", {"rl": {}})
    t.log({"x": 1.0}, step=0)
    t.log_skills([{"skill": "s"}], step=0)
    assert t.run is None and t.log_dvc_outputs(tmp_path / "missing.lock") == []
    t.finish()
    assert not os.listdir(tmp_path)


@pytest.mark.e2e  # an offline W&B run starts its wandb-core service process
def test_track_stage_summary(wandb_dirs):
    from seed_core.tracking import flat_numbers, track_stage

    assert flat_numbers({"base": {"valid_seen": {"success/macro": 0.5, "n": 2, "ok": True}}, "name": "x"}) == {
        "base/valid_seen/success/macro": 0.5,
        "base/valid_seen/n": 2,
    }
    track_stage("evaluate", load_params(REPO / "params.yaml"), {"base": {"valid_seen": {"success/macro": 0.25}}})
    flush()
    (binary,) = (wandb_dirs["WANDB_DIR"] / "wandb").glob("offline-run-*/run-*.wandb")
    assert b"base/valid_seen/success/macro" in binary.read_bytes()
