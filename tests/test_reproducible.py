"""Two runs of the same code leave the same bytes (README, "Did I get what you got?")."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc.dependency.param import ParamsDependency
from dvc.repo import Repo

from seed_core.stages.rl import diff_params  # the RL stage names changed parameters the same way

pytestmark = pytest.mark.e2e  # interpreters and a DVC repo

REPO = Path(__file__).resolve().parents[1]

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


def stale_stages(repo_dir: Path) -> dict[str, list[str]]:
    """{stage: what is stale} for each stage of dvc.yaml with no dvc.lock entry, or one made under other params."""
    locked = (yaml.safe_load((repo_dir / "dvc.lock").read_text()) or {}).get("stages", {})
    stale = {}
    with Repo(str(repo_dir)) as repo:
        for stage in repo.index.stages:
            if stage.name not in locked:
                stale[stage.name] = ["no entry in dvc.lock"]
                continue
            params = locked[stage.name].get("params", {})
            diffs = [
                d
                for dep in stage.deps
                if isinstance(dep, ParamsDependency)
                for d in diff_params(params.get(dep.def_path, {}), dep.read_params())
            ]
            if diffs:
                stale[stage.name] = diffs
    return stale


def test_committed_dvc_lock_is_the_reference_run_of_todays_params():
    stale = stale_stages(REPO)
    assert not stale, (
        "dvc.lock is stale ("
        + "; ".join(f"{stage}: {', '.join(why)}" for stage, why in stale.items())
        + "): make it the reference run again, a fresh clone's `make run`, and commit its dvc.lock and metrics/"
    )


def test_a_stale_lock_is_named_with_what_changed(tmp_path):
    for name in ("dvc.yaml", "dvc.lock", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    Repo.init(str(tmp_path), no_scm=True).close()
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    games = params["prepare"]["train_games"]
    params["prepare"]["train_games"] = games + 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    lock = yaml.safe_load((tmp_path / "dvc.lock").read_text())
    del lock["stages"]["eval_table"]
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))

    assert stale_stages(tmp_path) == {
        "prepare": [f"prepare.train_games: {games} -> {games + 1}"],
        "eval_table": ["no entry in dvc.lock"],
    }
