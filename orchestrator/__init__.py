"""orch: run fine-tuning jobs on rented SSH GPU servers from a laptop.

The laptop side never imports torch; the server side lives in ``remote_payload``.
"""

__version__ = "0.1.0"
