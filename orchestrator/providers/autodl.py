"""AutoDL's developer API for Pro instances (docs/providers.md cites every path used).

Every answer is an envelope ``{"code", "msg", "data"}``; ``code == "Success"`` is the only
success. The token goes in the ``Authorization`` header as it is. Prices are in milliyuan
(thousandths of a CNY) and are returned in yuan per hour. A powered-off instance is released by
AutoDL 15 days after it stopped. Every field of an answer is checked before use: a port that is
not a port, an address with spaces, or a missing field is a ``ProviderError``, never a guess.
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator.providers.api import (Endpoint, Instance, OutOfStock, Provider, ProviderAuthError, ProviderError,
                                        State)
from orchestrator.providers.http import JsonClient

API_URL = "https://api.autodl.com"
BASE = "/api/v1/dev/instance/pro"
RELEASE_AFTER = timedelta(days=15)
STATES: dict[str, State] = {
    "running": "running", "shutdown": "off", "starting": "starting", "shutting_down": "stopping",
    "creating": "creating", "releasing": "released", "released": "released", "failed": "failed",
}
_AUTH_WORDS = ("token", "auth", "unauthor", "实名")
_STOCK_WORDS = ("库存", "无可用", "资源不足", "售罄", "no stock", "sold out", "no available", "out of stock")
_ADDRESS = re.compile(r"^[A-Za-z0-9.:\[\]-]{1,253}$")


class AutoDL(Provider):
    """AutoDL Pro instances for one developer token."""

    name = "autodl"

    def __init__(self, token: str, api_url: str | None = None) -> None:
        self.http = JsonClient(self.name, api_url or API_URL, {"Authorization": token})

    def _call(self, method: str, action: str, args: dict[str, Any]) -> Any:
        if method == "GET":
            envelope = self.http.request("GET", f"{BASE}/{action}", action,
                                         query={k: str(v) for k, v in args.items()})
        else:
            envelope = self.http.request("POST", f"{BASE}/{action}", action, body=args)
        if not isinstance(envelope, dict) or not isinstance(envelope.get("code"), str):
            raise ProviderError(self.name, action, "answer is not AutoDL's {code, msg, data} envelope")
        if envelope["code"] == "Success":
            return envelope.get("data")
        msg = str(envelope.get("msg") or envelope["code"])[:300]
        text = f"{envelope['code']} {msg}".lower()
        if any(word in text for word in _AUTH_WORDS):
            raise ProviderAuthError(self.name, action, msg)
        if any(word in text for word in _STOCK_WORDS):
            raise OutOfStock(self.name, action, msg)
        raise ProviderError(self.name, action, msg)

    def _listed(self, instance_id: str) -> dict[str, Any]:
        """The instance's row of ``list`` (there is no per-instance GET), every page walked."""
        page, last = 1, 1
        while page <= min(last, 100):
            data = self._call("POST", "list", {"page_index": page, "page_size": 100})
            rows = data.get("list") if isinstance(data, dict) else None
            if not isinstance(rows, list):
                raise ProviderError(self.name, "list", "answer has no instance list")
            for row in rows:
                if isinstance(row, dict) and row.get("uuid") == instance_id:
                    return row
            last = data.get("max_page") if isinstance(data.get("max_page"), int) else 1
            page += 1
        raise ProviderError(self.name, "list", f"no instance {instance_id} in this account")

    def _snapshot(self, instance_id: str) -> dict[str, Any]:
        data = self._call("GET", "snapshot", {"instance_uuid": instance_id})
        if not isinstance(data, dict):
            raise ProviderError(self.name, "snapshot", "answer holds no snapshot")
        return data

    def instance(self, instance_id: str) -> Instance:
        row = self._listed(instance_id)
        status = str(row.get("status") or "")[:40]
        state = STATES.get(status, "unknown")
        stopped = _time(row.get("stopped_at"))
        price = self._snapshot(instance_id).get("payg_price")
        return Instance(id=instance_id, state=state, status=status,
                        price_per_hour=round(price / 1000, 2) if isinstance(price, (int, float)) else None,
                        currency="CNY", release_at=stopped + RELEASE_AFTER if state == "off" and stopped else None)

    def state(self, instance_id: str) -> tuple[State, str]:
        """The state from ``status`` (one cheap call): orch's word and AutoDL's."""
        status = self._call("GET", "status", {"instance_uuid": instance_id})
        status = str(status)[:40]
        return STATES.get(status, "unknown"), status

    def endpoint(self, instance_id: str) -> Endpoint:
        snap = self._snapshot(instance_id)
        address, port, password = snap.get("proxy_host"), snap.get("ssh_port"), snap.get("root_password")
        if not (isinstance(address, str) and _ADDRESS.match(address) and isinstance(port, int)
                and 1 <= port <= 65535 and isinstance(password, str) and password):
            raise ProviderError(self.name, "snapshot", "no complete SSH endpoint yet (host, port and password); "
                                "the instance may still be starting")
        return Endpoint(address=address, port=port, user=_user(snap.get("ssh_command")), password=password)

    def power_on(self, instance_id: str) -> None:
        self._call("POST", "power_on", {"instance_uuid": instance_id, "payload": "gpu"})

    def power_off(self, instance_id: str) -> None:
        self._call("POST", "power_off", {"instance_uuid": instance_id})

    def release(self, instance_id: str) -> None:
        self._call("POST", "release", {"instance_uuid": instance_id})


def _user(command: object) -> str:
    """The login user of the snapshot's ``ssh_command`` (``ssh -p 1 root@host``), else root."""
    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        words = []
    for word in words:
        user, at, _ = word.partition("@")
        if at and re.match(r"^[a-z_][a-z0-9_-]{0,31}$", user):
            return user
    return "root"


def _time(value: object) -> datetime | None:
    """AutoDL's time: an ISO string, or Go's ``{"Time": ..., "Valid": bool}``; None otherwise."""
    if isinstance(value, dict):
        value = value.get("Time") if value.get("Valid") else None
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone(timedelta(hours=8)))
