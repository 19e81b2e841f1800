"""Two runs of the same code leave the same bytes (README, "Did I get what you got?")."""

import json
import subprocess
import sys

SAVE = """
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from seed_core.models import save_adapter

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2)
model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"))
out = Path(sys.argv[1])
model.save_pretrained(out / "peft")
save_adapter(model, out / "ours")
"""


def test_adapter_config_is_the_same_bytes_whatever_the_hash_seed(tmp_path):
    def save(seed: str) -> tuple[str, str]:
        out = tmp_path / seed
        subprocess.run([sys.executable, "-c", SAVE, str(out)], check=True, env={"PYTHONHASHSEED": seed})
        return tuple((out / kind / "adapter_config.json").read_text() for kind in ("peft", "ours"))

    (peft_1, ours_1), (peft_2, ours_2) = save("1"), save("2")
    assert peft_1 != peft_2, "peft's own file no longer depends on the hash seed: save_adapter's sort can go"
    assert ours_1 == ours_2
    ours, peft = json.loads(ours_1), json.loads(peft_1)
    assert ours["target_modules"] == sorted(peft["target_modules"]) and len(ours["target_modules"]) == 7
    assert ours == peft | {"target_modules": ours["target_modules"]}
