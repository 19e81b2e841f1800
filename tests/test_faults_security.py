"""Fault injection, security: a checkpoint that only exists as a pickle (which could run code when loaded) is
refused without being unpickled, and every server the project starts or talks to by default is bound to (or
points at) the loopback interface."""

from __future__ import annotations

import ipaddress
import os
import pickle
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from faultsuite import intact
from seed_core.config import TeacherConfig
from seed_core.models import ModelError, load_model
from seed_core.stages.prepare import check_model_source

REPO = Path(__file__).resolve().parent.parent


class Payload:
    """Unpickling this writes a marker file: proof that a loader unpickled the checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pickle code ran\n"))


@pytest.mark.fault("security", n=2)
def test_pickle_only_checkpoint_is_refused_without_unpickling(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    with open(model_dir / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": Payload(marker)}, f)
    assert not marker.exists()

    with intact(model_dir):
        with pytest.raises(ModelError) as e:  # 1. the loader every stage uses
            load_model(model_dir)
        msg = str(e.value)
        assert msg.startswith(f"no safetensors weights in {model_dir} (only pickle files: pytorch_model.bin)")
        assert "loaded from safetensors only" in msg and "save_pretrained(folder, safe_serialization=True)" in msg
        with pytest.raises(ModelError, match="holds no HF checkpoint"):  # 2. prepare, as model.name_or_path
            check_model_source(str(model_dir))
    assert not marker.exists()  # nothing was unpickled

    # The same folder with safetensors weights next to the pickle loads them and ignores the pickle.
    shutil.copy(tiny_model_dir / "model.safetensors", model_dir / "model.safetensors")
    model, _ = load_model(model_dir)
    assert not marker.exists() and sum(p.numel() for p in model.parameters()) > 0


def _loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


@pytest.mark.fault("security")
def test_servers_bind_loopback_by_default(tmp_path, monkeypatch):
    # The teacher endpoint: the default and every shipped params file point at this machine.
    assert _loopback(urlparse(TeacherConfig().base_url).hostname)
    for f in [REPO / "params.yaml", *sorted((REPO / "recipes").glob("*.yaml"))]:
        url = (yaml.safe_load(f.read_text()) or {}).get("teacher", {}).get("base_url")
        assert url is None or _loopback(urlparse(url).hostname), f"{f}: teacher.base_url {url}"

    # The servers Prefect starts for the project: `prefect server start` (README) and `seed serve`'s runner
    # webserver (off unless enabled).
    from prefect.settings import get_current_settings

    s = get_current_settings()
    assert _loopback(s.server.api.host) and _loopback(s.runner.server.host) and s.runner.server.enable is False

    # The temporary server a stage starts when no PREFECT_API_URL is set: started for real, its listening
    # sockets read back from the kernel.
    import psutil
    from prefect.server.api.server import SubprocessASGIServer

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    server = SubprocessASGIServer()
    try:
        server.start(timeout=120)
        proc = psutil.Process(server.server_process.pid)
        procs = [proc, *proc.children(recursive=True)]
        listening = [c.laddr for p in procs for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening, "the server is not listening"
        assert all(_loopback(a.ip) for a in listening), listening
        assert server.api_url.startswith(f"http://127.0.0.1:{server.port}/")
    finally:
        server.stop()
    assert os.environ.get("PREFECT_API_URL") is None
