"""Slurm through its command-line clients (sbatch, squeue, sacct, scancel, sinfo), and a job on a
cluster seen from the login node.
"""
