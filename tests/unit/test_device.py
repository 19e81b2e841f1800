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
    "speedup,expected",
    [(2.3, torch.bfloat16), (1.3, torch.bfloat16), (1.1, torch.float32), (0.57, torch.float32), (0.0, torch.float32)],
)
def test_auto_dtype_on_a_cpu_is_bf16_only_where_it_measured_faster(monkeypatch, speedup, expected):
    """2.3x: the AMD EPYC with AVX-512 BF16; 0.57x: an Intel one without AMX; 0.0: no bf16 in oneDNN."""
    from seed_core import models

    monkeypatch.setattr(models, "cpu_bf16_speedup", lambda: speedup)
    assert models.pick_dtype("auto", "cpu") == expected
    assert models.pick_dtype("float32", "cpu") == torch.float32  # an explicit dtype is never second-guessed


def test_the_bf16_probe_measures_this_cpu():
    from seed_core.models import cpu_bf16_speedup

    speedup = cpu_bf16_speedup()
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert speedup == 0.0
    else:
        assert 0.05 < speedup < 20 and cpu_bf16_speedup() == speedup  # a ratio of two timings, measured once
