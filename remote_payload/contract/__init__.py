"""What laptop and server share, the only server code the laptop imports: states, requests, schemas, pure rules.

Job states, the request table and its framing, the training-config schema, precision rules, the pure half of
the Slurm rules and job-folder names. Standard library only (pydantic in ``train_config`` alone); it imports
nothing else of ``remote_payload``.
"""
