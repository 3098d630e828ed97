"""What the laptop and the server share, and the only server code the laptop imports: job states, the
request table and framing, the training-config schema, precision rules, the pure Slurm rules, job-
folder names. Standard library only (pydantic in ``train_config`` alone); imports nothing else of
``remote_payload``.
"""
