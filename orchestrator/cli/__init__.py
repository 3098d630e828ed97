"""The ``orch`` command line: one module per command, errors mapped in ``main``."""
