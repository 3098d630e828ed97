"""Pure: a validated spec + host facts -> the Plan (argv per node, a Slurm batch script) that --dry-run prints."""
