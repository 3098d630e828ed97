"""Slurm through its command-line clients (sbatch, squeue, sacct, scancel, sinfo); a cluster job from the login node."""
