"""Every pipeline recipe is a complete params file, and every sweep fits every recipe.

A recipe becomes params.yaml one way (README, each recipe's header): `cp recipes/<x>.yaml params.yaml && dvc repro`.
`seed params` fills a missing key from the dataclass default, but DVC reads the file itself and refuses a stage
whose declared params are absent ("Parameters 'vision' are missing from 'params.yaml'"), so a recipe must carry
every key: a parameter added to `seed_core/config.py` fails here until every recipe has it. Sweeps run as
`dvc exp run -S key=value`, which refuses a key the params file lacks, so each override must name an existing key.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seed_core.config import ConfigError, Params, params_from_dict, to_dict
from seed_core.tools.sweep import Combo, check_combos, check_params, load_recipe

REPO = Path(__file__).resolve().parents[2]
# sdar_skills_*.yaml are SDAR's fixed skills (rl.sdar_skills), not params files
RECIPES = sorted(p for p in (REPO / "recipes").glob("*.yaml") if not p.name.startswith("sdar_skills"))
SWEEPS = sorted((REPO / "recipes" / "sweeps").glob("*.yaml"))
DVC = Path(sys.executable).with_name("dvc")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _leaves(raw: dict, prefix: str = "") -> list[str]:
    """Dotted keys of every non-mapping value: `evaluate.generation.top_p`, not `evaluate.generation`."""
    out = []
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        out += _leaves(value, dotted) if isinstance(value, dict) else [dotted]
    return out


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("recipe", RECIPES, ids=_name)
def test_seed_params_accepts_the_recipe(recipe):
    params_from_dict(_load(recipe))


@pytest.mark.parametrize("recipe", RECIPES, ids=_name)
def test_recipe_carries_every_parameter(recipe):
    have = set(_leaves(_load(recipe)))
    missing = [key for key in _leaves(to_dict(Params())) if key not in have]
    assert not missing, (
        f"{_name(recipe)} lacks {missing}. Every recipe is a complete params file "
        f"(`cp {_name(recipe)} params.yaml && dvc repro`, and DVC refuses a stage whose params are absent): "
        f"add these keys to it, with the defaults `seed params --explain` lists unless the recipe needs others"
    )


@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory) -> Path:
    """A scratch DVC project holding what `dvc repro --dry` reads: dvc.yaml, .dvcignore and the tracked files
    dvc.yaml lists as deps. No git (`dvc init --no-scm`) and no dvc.lock: every stage is stale, so each one's
    params are read."""
    root = tmp_path_factory.mktemp("dvc-recipes")
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    )
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    deps = {d for s in stages.values() for d in s.get("do", s).get("deps", [])}
    for rel in sorted(({"dvc.yaml", ".dvcignore"} | deps) & tracked):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, root / rel)
    proc = _dvc(root, "init", "--no-scm", "-q")
    assert proc.returncode == 0, proc.stderr
    return root


def _dvc(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    return subprocess.run([str(DVC), *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _lookup(raw: dict, dotted: str):
    for part in dotted.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def _stand_in(path: Path) -> None:
    if path.exists():
        return
    if path.suffix == ".json":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    else:
        path.mkdir(parents=True)


@pytest.mark.e2e
@pytest.mark.parametrize("recipe", RECIPES, ids=_name)
def test_dvc_accepts_the_recipe_as_params_yaml(dvc_repo, recipe):
    raw = _load(recipe)
    shutil.copyfile(recipe, dvc_repo / "params.yaml")
    expected = []
    for name, stage in yaml.safe_load((dvc_repo / "dvc.yaml").read_text())["stages"].items():
        items: list = [None]
        if "foreach" in stage:  # `foreach: ${evaluate.models}`: one stage per item, `evaluate@rl`
            items = _lookup(raw, stage["foreach"].removeprefix("${").removesuffix("}"))
            items = items if isinstance(items, list) else []  # DVC's own error names the missing key
        expected += [f"{name}@{item}" if item is not None else name for item in items]
        # stand-ins for the untracked deps (stage outputs, which a fresh clone lacks): `dvc repro --dry` stops at the
        # first missing one, and `--force` would skip the params check
        for dep in stage.get("do", stage).get("deps", []):
            for item in items:
                _stand_in(dvc_repo / (dep if item is None else dep.replace("${item}", str(item))))
    proc = _dvc(dvc_repo, "repro", "--dry")
    out = proc.stdout + proc.stderr
    ran = re.findall(r"^Running stage '([^']+)'", proc.stdout, flags=re.M)
    assert proc.returncode == 0 and "missing" not in out.lower() and sorted(ran) == sorted(expected), (
        f"`cp {_name(recipe)} params.yaml && dvc repro --dry` exited {proc.returncode}, ran {ran} (expected "
        f"{expected}):\n{out[-2000:]}\nEvery recipe is a complete params file: add what DVC names to {_name(recipe)}"
    )


@pytest.mark.parametrize("recipe", RECIPES, ids=_name)
@pytest.mark.parametrize("sweep", SWEEPS, ids=_name)
def test_every_sweep_run_fits_every_recipe(sweep, recipe):
    for combo in load_recipe(sweep):
        try:
            check_params(recipe, combo.overrides)
        except ConfigError as e:
            pytest.fail(f"{_name(sweep)} run {combo.name} on {_name(recipe)}: {e}")


@pytest.mark.fault("params")
def test_a_sweep_override_missing_from_params_yaml_is_refused(tmp_path):
    (tmp_path / "params.yaml").write_text("rl:\n  seed: 0\n")
    with pytest.raises(ConfigError) as e:
        check_combos(tmp_path, [Combo("seed", 0, {"rl.seed": 0, "rl.tis": "auto", "vision.trainable": False})])
    assert str(e.value) == (
        f"sweep run seed-s0: {tmp_path / 'params.yaml'} lacks `rl.tis`, `vision.trainable`: `dvc exp run -S "
        "KEY=VALUE` sets only keys the params file already has. Add them to params.yaml (`seed params --explain` "
        "lists every key and its default), or start from a recipe, which carries every key: "
        "cp recipes/<recipe>.yaml params.yaml"
    )
    with pytest.raises(ConfigError, match=r"unknown key `rl\.methd`"):  # a misspelt key: the validation's message
        check_params(tmp_path / "params.yaml", {"rl.methd": "grpo"})
