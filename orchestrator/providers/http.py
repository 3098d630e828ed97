"""One JSON-over-HTTP client on the standard library (``urllib``) for every provider.

Contracts: every request has a timeout (``ORCH_PROVIDER_TIMEOUT_S``, 30 s); a request is sent
once, never retried here (callers decide: creation never is); an answer is read up to 4 MiB and
parsed as JSON (an empty answer, as to a DELETE, is None), anything else is a
``ProviderError``; an HTTP error carries its status; 401/403 is ``ProviderAuthError``, a refused
connection, DNS failure or timeout ``ProviderUnreachable`` (``maybe_sent`` false only for the
first two, where the provider surely never saw the request).

The token never goes anywhere but the API it was given for:

- it travels in a header only: never part of a URL, a message or a log line;
- the API's URL must be https, or plain http to this machine (``hosts/apiurl.py``); any other
  is refused before anything is sent (``UsageError``, exit 2);
- no redirect is followed: ``urllib`` would copy every header, ``Authorization`` included, to
  wherever a 3xx points (another host, plain http). A 3xx answer is ``ProviderRedirected``
  (exit 3, like an API that cannot be reached: orch cannot use the API at that address),
  naming where it pointed; nothing is sent there;
- a plain-http (loopback) URL is asked directly, never through an ``http_proxy`` from the
  environment (which would see the token in clear); https goes through a proxy only as a
  tunnel (``CONNECT``), where the proxy sees no header.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, NoReturn

from orchestrator import settings
from orchestrator.errors import UsageError
from orchestrator.hosts.apiurl import api_url_problem
from orchestrator.providers.api import ProviderAuthError, ProviderError, ProviderUnreachable
from orchestrator.termtext import clean

MAX_ANSWER = 4 * 1024 * 1024
MAX_WHERE = 200  # characters of a redirect's target named in a message
REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # a provider's request id (AutoDL's envelope) fit to quote


def timeout_s() -> float:
    return settings.PROVIDER_TIMEOUT.seconds()


class ProviderRedirected(ProviderUnreachable):
    """The API answered with a redirect (3xx); it was not followed and the token went nowhere
    else. ``location``: where it pointed (cut, control characters dropped), "" when it said
    nowhere. Exit 3."""

    def __init__(self, provider: str, call: str, status: int, location: str, base: str) -> None:
        self.location = location
        where = f" to {location}" if location else " (to no Location)"
        super().__init__(provider, call, f"{base} answered HTTP {status}, a redirect{where}; orch follows no redirect "
                         "with the token: if that is the API's new address, give it as --api-url "
                         "(`orch hosts add NAME ... --api-url URL`)")
        self.status = status


class _Refuse(urllib.request.HTTPRedirectHandler):
    """Follows nothing: every 3xx comes back to ``JsonClient.request`` as an ``HTTPError``."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def opener_for(url: str) -> urllib.request.OpenerDirector:
    """An opener that follows no redirect; for plain http (loopback only) one that also uses no
    proxy from the environment."""
    handlers: list[urllib.request.BaseHandler] = [_Refuse()]
    if urllib.parse.urlsplit(url).scheme == "http":
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


def check_api_url(url: str) -> None:
    """``UsageError`` (exit 2) when a token may not be sent to ``url`` (``hosts/apiurl.py``)."""
    problem = api_url_problem(url)
    if problem:
        raise UsageError(f"invalid --api-url: {problem}")


class JsonClient:
    """Requests to ``base_url`` with fixed ``headers`` (the token); ``provider`` names errors.
    The URL is checked here (``check_api_url``) before anything can be sent."""

    def __init__(self, provider: str, base_url: str, headers: dict[str, str]) -> None:
        check_api_url(base_url)
        self.provider, self.base = provider, base_url.rstrip("/")
        self.headers = {"Accept": "application/json", "User-Agent": "orch-gpu", **headers}
        self.opener = opener_for(self.base)

    def request(self, method: str, path: str, call: str, *, query: dict[str, str] | None = None,
                body: dict[str, Any] | None = None) -> Any:
        """The parsed JSON answer of one request; raises as the module docstring says."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers, **({"Content-Type": "application/json"} if data is not None else {}))
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self.opener.open(req, timeout=timeout_s()) as answer:
                raw = answer.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            self._http_error(exc, call, url)
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

    def _http_error(self, exc: urllib.error.HTTPError, call: str, url: str) -> NoReturn:
        """The error for an HTTP error answer (a 3xx among them: never followed)."""
        if 300 <= exc.code < 400:
            location = exc.headers.get("Location", "") if exc.headers is not None else ""
            where = urllib.parse.urljoin(url, clean(str(location)).strip()) if location else ""
            raise ProviderRedirected(self.provider, call, exc.code, where[:MAX_WHERE], self.base) from None
        text = _words(exc.read(4096))
        if exc.code in (401, 403):
            raise ProviderAuthError(self.provider, call, f"the token was refused (HTTP {exc.code}){text}",
                                    status=exc.code) from None
        raise ProviderError(self.provider, call, f"HTTP {exc.code}{text}", status=exc.code) from None


def request_id(value: object) -> str:
    """``value`` when it is a request id fit to quote in a message (``REQUEST_ID``: untrusted
    text), else ""."""
    return value if isinstance(value, str) and REQUEST_ID.match(value) else ""


def cite(rid: str) -> str:
    """`` (request_id RID)`` for the end of a message, or nothing when ``rid`` is ""."""
    return f" (request_id {rid})" if rid else ""


def _words(raw: bytes) -> str:
    """A provider's error body as a short suffix for a message (untrusted: decoded, cut,
    control characters dropped)."""
    text, cited = raw.decode("utf-8", "replace").strip(), ""
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):  # vast: msg/error; RFC 9457 problem (RunPod v2): detail, errors
            text = str(parsed.get("msg") or parsed.get("error") or parsed.get("message") or parsed.get("detail")
                       or text)
            if isinstance(parsed.get("errors"), list) and parsed["errors"]:
                text += " (" + "; ".join(str(e) for e in parsed["errors"][:5]) + ")"
            cited = cite(request_id(parsed.get("request_id")))  # AutoDL's envelope: what its support asks for
    except ValueError:
        pass
    text = clean(" ".join(text.split()))
    return f": {text[:300]}{cited}" if text else ""
