"""The `rl` stage: Stage 2 (`seed_core.method.update.Trainer`) for rl.epochs checkpointed, resumable epochs.

Each parameter set trains in its own run folder (`<method>-<advantage>-s<seed>-<hash>`, the hash of the
parameters that shape the run and of the starting weights). An epoch is `rl.updates_per_epoch` updates, a
greedy validation on a fixed valid_seen panel, and one `epoch_NNN/` folder (trainable weights, optimizer
state, skill corpus, metrics) published atomically. A killed run resumes after its last complete epoch and
refuses checkpoints made under different parameters; `rl.epochs` is left out of the run's identity, so more
epochs extend a finished run and fewer stop at the run's own last epoch.

The stage by job: `identity` (the run folder and its fingerprint), `checkpoints` (epoch folders), `loop` (`RLRun`,
`train`), `export` (the final model and metrics), `ranks` (one rank of a distributed run).
"""

from seed_core.stages.rl.checkpoints import epoch_summary, load_epoch, save_epoch
from seed_core.stages.rl.export import write_outputs
from seed_core.stages.rl.identity import INIT, PATHS, diff_params, fingerprint, open_run_dir, run_folder_name
from seed_core.stages.rl.loop import RLRun, games_for_update, train
from seed_core.stages.rl.ranks import main

__all__ = [
    "INIT", "PATHS", "RLRun", "diff_params", "epoch_summary", "fingerprint", "games_for_update", "load_epoch", "main",
    "open_run_dir", "run_folder_name", "save_epoch", "train", "write_outputs",
]  # fmt: skip
