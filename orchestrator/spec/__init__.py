"""job.yaml: pydantic models, load_spec (the only I/O) with file:line errors in plain words, sweep keys, launch.slurm."""
