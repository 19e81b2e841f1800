"""People-facing tools: the `seed` command line, the comparison report, lineage review, sweeps, the skill-corpus browser."""
