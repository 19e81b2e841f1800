"""Process-wide set-up shared by every stage: seeding, offline hub, quiet third-party defaults."""

from __future__ import annotations

import os
import random
import resource


def seed_everything(seed: int) -> None:
    """The one seeding function: Python, NumPy and torch (CPU and CUDA) from one stage seed."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def derive_seed(base: int, *keys: int, stride: int) -> int:
    """The seed of one random stream, from a stage seed `base` and the stream's position `keys` (outermost first):
    base * stride + keys[0], times stride plus keys[1], and so on. Each stream has its own `stride` (a prime, or the
    count of what the key enumerates), so two streams at equal keys draw differently."""
    for key in keys:
        base = base * stride + key
    return base


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup(offline: bool = True) -> None:
    """Offline hub unless the user turned it off; W&B offline unless configured."""
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
