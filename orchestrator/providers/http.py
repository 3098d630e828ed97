"""One JSON-over-HTTP client on the standard library (``urllib``) for every provider.

Contracts: every request has a timeout (``ORCH_PROVIDER_TIMEOUT_S``, 30 s); a request is sent
once, never retried here (callers decide: creation never is); an answer is read up to 4 MiB and
parsed as JSON (an empty answer, as to a DELETE, is None), anything else is a
``ProviderError``; an HTTP error carries its status; 401/403 is ``ProviderAuthError``, a refused
connection, DNS failure or timeout ``ProviderUnreachable`` (``maybe_sent`` false only for the
first two, where the provider surely never saw the request). The token travels in a header
only: it is never part of a URL, a message or a log line.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from orchestrator import settings
from orchestrator.providers.api import ProviderAuthError, ProviderError, ProviderUnreachable

MAX_ANSWER = 4 * 1024 * 1024


def timeout_s() -> float:
    return settings.PROVIDER_TIMEOUT.seconds()


class JsonClient:
    """Requests to ``base_url`` with fixed ``headers`` (the token); ``provider`` names errors."""

    def __init__(self, provider: str, base_url: str, headers: dict[str, str]) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ProviderError(provider, "api-url", f"{base_url!r} is not an http(s) URL")
        self.provider, self.base = provider, base_url.rstrip("/")
        self.headers = {"Accept": "application/json", "User-Agent": "orch-gpu", **headers}

    def request(self, method: str, path: str, call: str, *, query: dict[str, str] | None = None,
                body: dict[str, Any] | None = None) -> Any:
        """The parsed JSON answer of one request; raises as the module docstring says."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers, **({"Content-Type": "application/json"} if data is not None else {}))
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s()) as answer:
                raw = answer.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            text = _words(exc.read(4096))
            if exc.code in (401, 403):
                raise ProviderAuthError(self.provider, call, f"the token was refused (HTTP {exc.code}){text}",
                                        status=exc.code) from None
            raise ProviderError(self.provider, call, f"HTTP {exc.code}{text}", status=exc.code) from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", None) or exc
            unsent = isinstance(reason, (ConnectionRefusedError, socket.gaierror))
            raise ProviderUnreachable(self.provider, call, f"cannot reach {self.base}: {reason}",
                                      maybe_sent=not unsent) from None
        if len(raw) > MAX_ANSWER:
            raise ProviderError(self.provider, call, f"answer larger than {MAX_ANSWER} bytes")
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ProviderError(self.provider, call, f"answer is not JSON:{_words(raw[:200])}") from None


def _words(raw: bytes) -> str:
    """A provider's error body as a short suffix for a message (untrusted: decoded, cut)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):  # vast: msg/error; RFC 9457 problem (RunPod v2): detail, errors
            text = str(parsed.get("msg") or parsed.get("error") or parsed.get("message") or parsed.get("detail")
                       or text)
            if isinstance(parsed.get("errors"), list) and parsed["errors"]:
                text += " (" + "; ".join(str(e) for e in parsed["errors"][:5]) + ")"
    except ValueError:
        pass
    return f": {text[:300]}" if text else ""
