"""Put the comparison's start back into a runner checkout, so that every arm, in every session, starts from the same
Stage-1 analyzer whatever CPU the session got (bf16 kernels differ between CPUs: the shared stages re-made on another
machine train a different warm-up and analyzer).

The pack (next to this file) holds what the shared stages made that cannot be re-made bit for bit elsewhere: the
warm-up's and the analyzer's LoRA adapters, the analyzer's SFT set (data/sft) and those stages' metrics. The merged
checkpoints are rebuilt exactly as `seed_core.sft` writes them (fp32 weights of the stage's input, the adapter
loaded on them with peft, merged). Use, in a checkout of the runner commit with its venv:

    cp recipes/sokoban.yaml params.yaml && dvc repro -s prepare      # models/base, data/manifests (deterministic)
    python ../main/reports/sokoban-comparison/start/restore.py .        # models/perception, warmup, analyzer, data/sft
    dvc commit -f warmup build_sft_data train_analyzer                 # the shared stages are now up to date

It then checks every restored file against the md5s the original run locked (pack/md5.json) and says which differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

PACK = Path(__file__).resolve().parent / "pack"
MODEL_FILES = (
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def merged(base: Path, adapter: Path, out: Path) -> None:
    """out = base's fp32 weights with the adapter merged in, plus the adapter folder and base's tokenizer files."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    full = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, use_safetensors=True)
    PeftModel.from_pretrained(full, adapter).merge_and_unload().save_pretrained(tmp, safe_serialization=True)
    for name in MODEL_FILES:
        shutil.copy2(base / name, tmp / name)
    shutil.copytree(adapter, tmp / "adapter")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", type=Path, help="the runner checkout (after `dvc repro -s prepare`)")
    repo = ap.parse_args().repo.resolve()
    base = repo / "models" / "base"
    if not (base / "model.safetensors").is_file():
        raise SystemExit(f"error: {base} has no model.safetensors: run `dvc repro -s prepare` in {repo} first")
    shutil.rmtree(repo / "models" / "perception", ignore_errors=True)
    shutil.copytree(base, repo / "models" / "perception")  # text Sokoban has no perception SFT: a copy of base
    merged(base, PACK / "warmup_adapter", repo / "models" / "warmup")
    merged(repo / "models" / "warmup", PACK / "analyzer_adapter", repo / "models" / "analyzer")
    shutil.rmtree(repo / "data" / "sft", ignore_errors=True)
    shutil.copytree(PACK / "data_sft", repo / "data" / "sft")
    for f in (PACK / "metrics").iterdir():
        shutil.copy2(f, repo / "metrics" / f.name)
    want = json.loads((PACK / "md5.json").read_text())
    differ = [p for p, m in want.items() if md5(repo / p) != m]
    print(f"restored {len(want)} files; {len(want) - len(differ)} have the original run's md5")
    for p in differ:
        print(f"  differs: {p}")


if __name__ == "__main__":
    main()
