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
