"""``python -m orchestrator`` is ``orch``."""

from orchestrator.cli.main import main

main()
