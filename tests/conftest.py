"""Test set-up: real ALFWorld data from the repo's install, every HOME-like path in a temp folder."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytest_plugins = ["faultsuite"]

REPO = Path(__file__).resolve().parent.parent

# Before anything imports alfworld, prefect or wandb: they write under HOME-like paths on import.
_tmp_home = Path(tempfile.mkdtemp(prefix="seed-tests-"))
os.environ.setdefault("ALFWORLD_DATA", str(REPO / ".alfworld"))
os.environ["PREFECT_HOME"] = str(_tmp_home / "prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "90"
os.environ["WANDB_MODE"] = "disabled"
os.environ["WANDB_DIR"] = str(_tmp_home / "wandb")
for _var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
    os.environ[_var] = str(_tmp_home / _var.lower())
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ["RAY_AUTH_MODE"] = "disabled"


def pytest_collection_modifyitems(config, items):
    """Every test gets its lane, so each lane is one `-m`: `e2e` where a test says so (it starts processes, a DVC
    repo, a Prefect server, a browser or a benchmark), else `unit` under tests/unit (no games, no real model, no
    subprocess) and `integration` elsewhere (the real model and games, in this process)."""
    for item in items:
        if item.get_closest_marker("e2e") is None:
            item.add_marker("unit" if item.path.parent.name == "unit" else "integration")


def pytest_runtest_logreport(report):
    """A failure is printed when it happens, not only in the summary: a CI run stopped by its time limit never
    reaches the summary, and `-q`'s dots do not say which test failed."""
    if report.failed:
        print(f"\nFAILED {report.nodeid} ({report.when}):\n{report.longreprtext[-3000:]}", flush=True)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    """Keeps the unit lane what it says: a unit test that starts a process fails and says how to move it up."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(self, args, *a, **k):
        raise AssertionError(f"a unit test starts no process ({args!r}): mark the test @pytest.mark.e2e")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(scope="session")
def alfworld_root() -> Path:
    root = Path(os.environ["ALFWORLD_DATA"])
    if not (root / "json_2.1.1").is_dir():
        pytest.fail(f"ALFWorld data missing in {root}: run `make data` (or `seed data alfworld --archive ...`)")
    return root


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    """The real SmolLM2, converted once per session into a temp folder (or the repo's models/base)."""
    existing = REPO / "models" / "base"
    if (existing / "model.safetensors").exists():
        return existing
    from seed_core.models import convert_smollm2

    return convert_smollm2(_tmp_home / "models" / "base")


@pytest.fixture(scope="session")
def tiny_model_dir(base_model_dir, tmp_path_factory) -> Path:
    """A tiny random-init llama with the real SmolLM2 tokenizer, saved as a safetensors HF folder."""
    from helpers import tiny_policy

    out = tmp_path_factory.mktemp("tiny-model")
    policy = tiny_policy(base_model_dir)
    policy.model.save_pretrained(out, safe_serialization=True)
    policy.tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server on a free port of 127.0.0.1 with its own PREFECT_HOME; yields its API URL."""
    from repo_copy import BIN, stop

    home = tmp_path_factory.mktemp("prefect-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        PREFECT_HOME=str(home / "home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
    )
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, f"prefect server exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, f"prefect server not healthy after 180 s:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        yield url
    finally:
        stop(proc)
