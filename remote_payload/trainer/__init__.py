"""The built-in trainer (python -m remote_payload.train): setup, loop, model, data, checkpoints, export, metrics."""
