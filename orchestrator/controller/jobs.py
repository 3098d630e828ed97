"""The controller's managed jobs (stage 2 fills this in): ``attach`` hooks them into a ``Service``."""

from __future__ import annotations

from typing import Any

from orchestrator.controller.service import Service


def attach(service: Service) -> None:
    """Give ``service`` its duty (check every managed job) and its requests."""

    def describe() -> dict[str, Any]:
        return {"jobs": []}

    service.describe = describe
