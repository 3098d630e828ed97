"""``python -m orchestrator`` is ``orch``."""

from orchestrator.warm.client import main

main()
