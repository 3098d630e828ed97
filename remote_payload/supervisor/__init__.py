"""The per-node supervisor: setup, the job (torchrun, direct, or a Slurm allocation), manifest, state, on-finish."""
