"""Quality and behaviour evals over HTTP: determinism, workloads, prefix cache."""
