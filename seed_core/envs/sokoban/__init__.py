"""Sokoban: rooms from seeds, gym-sokoban's rules, a BFS solver, and the oracle teacher."""
