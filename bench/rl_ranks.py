"""One RL update on 2 ranks vs 1 rank on this machine; prints one JSON line of side-by-side ratios.

Each measurement is a torchrun launch of this script (`--rank`) on the embedded default's settings (params.yaml:
SmolLM2, real ALFWorld games, B games x N rollouts, the configured sampler): every rank builds the RL stage's own
Trainer from the RL starting model, runs one untimed update (engine warm-up), then times `Trainer.update` on the
update after it: collect (rank r plays games r, r + world, ...), analyze, re-score, optimize. 1-rank and 2-rank
launches alternate, `--repeats` times each. Run after `dvc repro train_analyzer` (it needs the manifests and the
starting model). On a 2-core CPU two ranks share the two cores that one rank uses alone: what the ratio shows there
is the cost of the collectives and of a sampler per rank, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def rank_main(params_path: str, out: Path) -> None:
    from seed_core import distributed
    from seed_core.config import load_params
    from seed_core.envs import environment
    from seed_core.method.update import Trainer
    from seed_core.models import load_for
    from seed_core.runtime import seed_everything
    from seed_core.stages.rl import INIT, games_for_update

    distributed.init()
    params = load_params(params_path)
    init = Path(INIT[params.rl.init])
    env = environment(params)
    train = env.read_manifest(Path("data/manifests/train.json"))
    model, tok = load_for(init, params.model, full_finetune=params.rl.lora_r is None)
    trainer = Trainer(model, tok, params, sampler_dir=init)
    times = []
    with env.open_pool(params.env.workers) as pool:
        for index in range(2):
            seed_everything(params.rl.seed * 10_000 + index)
            distributed.barrier()
            t0 = time.perf_counter()
            metrics, _ = trainer.update(pool, games_for_update(train, params.rl, index), index)
            times.append(time.perf_counter() - t0)
    trainer.close()
    if distributed.is_main():
        phases = {k: metrics[k] for k in metrics if k.startswith("time/")}
        out.write_text(json.dumps({"update_s": times[-1], **phases}))
    distributed.close()


def launch(n: int, params_path: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
               "--max-restarts=0", str(Path(__file__).resolve()), "--params", params_path, "--rank", str(out)]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{n}-rank launch failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--repeats", type=int, default=2, help="launches of each rank count, alternating")
    ap.add_argument("--rank", type=Path, help=argparse.SUPPRESS)  # set in the launched rank processes
    args = ap.parse_args()
    if args.rank:
        return rank_main(args.params, args.rank)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for n in (1, 2):
            runs[n].append(launch(n, args.params))
    median = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(json.dumps({
        "bench": "rl_ranks",
        "update_s_ratio_2_over_1": round(median[2]["update_s"] / median[1]["update_s"], 3),
        # per phase (time/update_s is the optimizer phase; the whole update is update_s above)
        **{f"phase_{k.split('/', 1)[1]}_ratio_2_over_1": round(median[2][k] / median[1][k], 3)
           for k in median[1] if k.startswith("time/") and median[1][k] > 0},
        "update_s": {n: [round(r["update_s"], 1) for r in rs] for n, rs in runs.items()},
        "repeats": args.repeats,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
