"""``orch tunnel``: a port of the box on the laptop, through orch's own SSH connection.

``ports.py`` reads what to forward; ``target.py`` finds where (a host, or a job's first node: a
Slurm job's compute node through its login node); ``link.py`` keeps the connection and opens each
forwarded stream on it, reconnecting after a dropped link or a power cycle; ``listen.py`` listens
on the laptop and splices every accepted connection to a stream (docs/commands.md: orch tunnel).
"""
