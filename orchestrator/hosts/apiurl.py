"""Where a provider's token may be sent: the one rule for an ``--api-url``.

A token travels only over https, or over plain http to this machine itself (a loopback
address: ``127.0.0.0/8``, ``::1``, ``localhost``: a stand-in, an SSH tunnel), and never in the
URL itself (no ``user:password@``). The inventory refuses any other URL when a host entry is
made or read (``hosts/inventory.py``: ``ProviderRef``), and ``providers/http.py`` before any
request, so a URL refused here never receives a token (exit 2 in both places).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost",)


def is_loopback(hostname: str) -> bool:
    """``hostname`` (as ``urlsplit`` gives it: lower case, no brackets) is this machine."""
    if hostname in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def api_url_problem(url: str) -> str | None:
    """Why ``url`` may not receive a provider's token (one line), or None when it may."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as exc:
        return f"{url!r} is not a URL orch can read ({exc})"
    if parts.scheme not in ("http", "https") or not hostname:
        return f"{url!r} is not an http(s) URL"
    if parts.username is not None or parts.password is not None:
        return "a user or password in the URL would be sent with every request: give the URL without it"
    if parts.scheme == "http" and not is_loopback(hostname):
        return (f"plain http to {hostname} would send the token unencrypted: orch sends it over https only "
                "(plain http only to this machine: 127.0.0.1, ::1, localhost)")
    return None
