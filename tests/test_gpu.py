"""On a CUDA machine only: every stage's models on the GPU, fp32 master weights for full fine-tuning, and
generation and scoring under bf16 autocast. Skipped without a GPU (CI and this project's CPU machines)."""

import pytest
import torch

from seed_core.config import ModelConfig
from seed_core.method.teachers import checkpoint_teacher
from seed_core.models import load_for
from seed_core.policy.hf import HFPolicy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible to torch here"),
]


def test_models_are_on_the_gpu_in_every_stage(tiny_model_dir):
    cfg = ModelConfig(device="auto")
    for full in (False, True):  # inference and LoRA (rollouts, evaluation, re-scoring), full fine-tuning (RL)
        model, tok = load_for(tiny_model_dir, cfg, full_finetune=full)
        assert {p.device.type for p in model.parameters()} == {"cuda"}
        if full:
            assert {p.dtype for p in model.parameters()} == {torch.float32}  # master weights
        policy = HFPolicy(model, tok, batch_size=2)
        (g,) = policy.generate(["Your task is to: look."], temperature=1.0, max_new_tokens=4, seed=0)
        lp = policy.score([policy.encoder.encode_prompt("Your task is to: look.")], [g.token_ids])[0]
        assert lp.device.type == "cuda" and lp.shape == (len(g.token_ids),) and torch.isfinite(lp).all()
    analyzer = checkpoint_teacher(tiny_model_dir, max_new_tokens=4, model=cfg, batch_size=2)
    assert analyzer.policy.device.type == "cuda"  # the Stage-1 and Stage-2 analyzer
