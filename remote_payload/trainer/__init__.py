"""The built-in trainer (entry point ``python -m remote_payload.train``): setup, loop, model, data,
checkpoints, export, metrics.
"""
