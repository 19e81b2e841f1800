"""ALFWorld: game data and manifests (`data`), the environment (`env`), the oracle teacher, and expert replay."""
