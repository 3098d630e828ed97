"""job.yaml: its pydantic models, ``load_spec`` (the only I/O), errors in plain words with file:line,
sweep keys, ``launch.slurm``.
"""
