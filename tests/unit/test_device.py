"""`model.device`: one code path from CPU to GPU, and a clear refusal of a device the machine lacks."""

import pytest
import torch

from seed_core.config import ConfigError, params_from_dict
from seed_core.models import ModelError, resolve_device


@pytest.mark.parametrize(("cuda", "name", "want"), [(False, "auto", "cpu"), (True, "auto", "cuda"),
                                                    (True, "cuda", "cuda"), (True, "cpu", "cpu"), (False, "cpu", "cpu")])  # fmt: skip
def test_resolve_device(monkeypatch, cuda, name, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device(name) == want


def test_cuda_without_a_gpu_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ModelError,
        match=r"`model.device` is cuda, but torch sees no CUDA device here .*set model.device to auto or cpu",
    ):
        resolve_device("cuda")


def test_unknown_device_is_a_config_error():
    with pytest.raises(ConfigError, match=r"`model.device` must be one of \['auto', 'cpu', 'cuda'\], got 'tpu'"):
        params_from_dict({"model": {"device": "tpu"}})


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match=r"`rollout.backend` must be one of \['hf', 'vllm'\], got 'sglang'"):
        params_from_dict({"rollout": {"backend": "sglang"}})
    with pytest.raises(ConfigError, match=r"`rl.tis_cap` must be >= 1, got 0.5"):
        params_from_dict({"rl": {"tis_cap": 0.5}})


def test_engine_sleep_needs_cuda():
    from seed_core.policy.vllm import VLLMPolicy

    with pytest.raises(ValueError, match=r"`vllm.sleep` needs a CUDA device .*set it false"):
        VLLMPolicy("models/base", None, dtype=torch.float32, device="cpu", seed=0, max_new_tokens=8, sleep=True)


@pytest.mark.parametrize(
    ("onednn_bf16", "vendor", "flags", "expected"),
    [
        (True, "AuthenticAMD", {"avx512_bf16", "avx512f"}, torch.bfloat16),  # the EPYC: 2.3x
        (True, "GenuineIntel", {"avx512_bf16", "avx512f"}, torch.float32),  # Intel without AMX: 0.57x
        (True, "GenuineIntel", {"avx512_bf16", "amx_bf16", "amx_tile"}, torch.bfloat16),  # a Xeon with AMX
        (False, "AuthenticAMD", {"avx2"}, torch.float32),  # no bf16 in oneDNN: emulated, always slower
    ],
)
def test_auto_dtype_on_a_cpu_follows_its_features(monkeypatch, onednn_bf16, vendor, flags, expected):
    """The same kind of CPU always gets the same dtype (a timing probe flipped under load)."""
    from seed_core import models

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn_bf16)
    monkeypatch.setattr(models, "cpu_facts", lambda: ("some CPU", vendor, frozenset(flags)))
    assert models.pick_dtype("auto", "cpu") == expected
    assert models.pick_dtype("float32", "cpu") == torch.float32  # an explicit dtype is never second-guessed


def test_cpu_facts_read_this_machine():
    from seed_core.models import cpu_facts

    name, vendor, flags = cpu_facts()
    info = open("/proc/cpuinfo").read()
    assert f"model name\t: {name}\n" in info and f"vendor_id\t: {vendor}\n" in info
    assert {"fpu", "sse2"} <= flags and all(f in info for f in flags)
