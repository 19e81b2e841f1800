"""Process-wide set-up shared by every stage: seeding, offline hub, quiet third-party defaults."""

from __future__ import annotations

import os
import random
import resource

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """The one seeding function: Python, NumPy and torch (CPU and CUDA) from one stage seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup(offline: bool = True) -> None:
    """Offline hub unless the user turned it off; W&B offline unless configured."""
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
