"""The per-node supervisor: setup, the job (under torchrun, started directly, or in a Slurm
allocation), manifest and state, then on-finish steps (standard library only).
"""
