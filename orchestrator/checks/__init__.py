"""What is wrong before a job runs: one verdict type; the laptop's checks, a host's preflight, a Slurm cluster's."""
