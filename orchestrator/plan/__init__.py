"""Pure: a validated spec + host facts -> the ``Plan`` (exact argv per node, a Slurm batch script)
that ``--dry-run`` prints.
"""
