"""`python -m seed_core.stages.rl`: one rank of a distributed run (what `launch` starts)."""

from seed_core.stages.rl.ranks import main

main()
