"""The token never leaves for another place (issue 37 item 3): ``providers/http.py`` follows no
redirect, asks a plain-http API only on this machine and never through an ``http_proxy``.

Two real HTTP servers on loopback: one answers a redirect (the API, or a proxy in front of
it), the other records every request it gets (where the redirect points, or the proxy). The
token must never reach the second."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.apiurl import api_url_problem
from orchestrator.providers.http import JsonClient, ProviderRedirected
from tests.support.orch import Orch

TOKEN = "tok-never-elsewhere-5d1f"


class Server:
    """A loopback HTTP server: every request is kept in ``seen`` (method, path, headers) and
    answered ``status`` with ``headers`` and a JSON body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.status, self.headers, self.body = 200, {}, b"{}"
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server.seen.append((self.command, self.path, dict(self.headers)))
                self.send_response(server.status)
                for key, value in server.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    """(the redirecting API, the place it points to), each a real server."""
    api, elsewhere = Server(), Server()
    yield api, elsewhere
    api.close()
    elsewhere.close()


def redirect(api: Server, status: int, to: str) -> None:
    api.status, api.headers, api.body = status, {"Location": to}, b""


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_a_redirect_is_an_error_naming_where_it_pointed_and_nothing_reaches_it(
        pair: tuple[Server, Server], status: int, method: str) -> None:
    api, elsewhere = pair
    redirect(api, status, elsewhere.url + "/steal?x=1")
    client = JsonClient("vast", api.url + "/api/v0", {"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(ProviderRedirected) as caught:
        client.request(method, "/instances/", "instances", body={"a": 1} if method == "POST" else None)
    assert caught.value.exit_code == 3 and caught.value.status == status
    assert caught.value.location == elsewhere.url + "/steal?x=1"
    assert f"answered HTTP {status}, a redirect to {elsewhere.url}/steal?x=1" in str(caught.value)
    assert "orch follows no redirect with the token" in str(caught.value)
    assert len(api.seen) == 1 and api.seen[0][2]["Authorization"] == f"Bearer {TOKEN}"
    assert elsewhere.seen == []


def test_a_relative_redirect_is_named_in_full_and_not_followed(pair: tuple[Server, Server]) -> None:
    api, _ = pair
    redirect(api, 302, "/v2/instances/")
    client = JsonClient("runpod", api.url + "/v1", {"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(ProviderRedirected) as caught:
        client.request("GET", "/pods", "pods")
    assert caught.value.location == api.url + "/v2/instances/"
    assert [(m, p) for m, p, _ in api.seen] == [("GET", "/v1/pods")]


def test_a_plain_http_api_on_this_machine_is_never_asked_through_a_proxy(
        pair: tuple[Server, Server], monkeypatch: pytest.MonkeyPatch) -> None:
    api, proxy = pair
    api.body = json.dumps({"ok": True}).encode()
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client = JsonClient("vast", api.url, {"Authorization": f"Bearer {TOKEN}"})
    assert client.request("GET", "/x", "x") == {"ok": True}
    assert len(api.seen) == 1 and proxy.seen == []


@pytest.mark.parametrize(("url", "words"), [
    ("http://203.0.113.5/api", "plain http to 203.0.113.5 would send the token unencrypted"),
    ("http://console.vast.ai", "plain http to console.vast.ai would send the token unencrypted"),
    ("http://127.0.0.1.example.com", "plain http to 127.0.0.1.example.com"),
    ("https://user:pw@console.vast.ai", "a user or password in the URL"),
    ("ftp://127.0.0.1", "is not an http(s) URL"),
    ("https://", "is not an http(s) URL"),
])
def test_a_token_is_refused_passage_to_anything_but_https_or_this_machine(url: str, words: str) -> None:
    assert words in (api_url_problem(url) or "")
    with pytest.raises(UsageError) as caught:
        JsonClient("vast", url, {"Authorization": f"Bearer {TOKEN}"})
    assert caught.value.exit_code == 2 and str(caught.value).startswith("invalid --api-url: ")


@pytest.mark.parametrize("url", ["https://console.vast.ai", "http://127.0.0.1:8080", "http://127.9.9.9",
                                 "http://[::1]:8765/x", "http://localhost:1", "https://203.0.113.5:443"])
def test_https_anywhere_and_plain_http_to_loopback_are_allowed(url: str) -> None:
    assert api_url_problem(url) is None


def test_orch_names_the_redirect_and_never_sends_the_token_there(orch: Orch, pair: tuple[Server, Server]) -> None:
    api, elsewhere = pair
    redirect(api, 307, elsewhere.url + "/api/v0/instances/7/")
    orch.env["ORCH_TEST_VAST_KEY"] = TOKEN
    orch("hosts", "add", "v7", "--provider", "vast", "--instance", "7", "--token-env", "ORCH_TEST_VAST_KEY",
         "--api-url", api.url)
    up = orch("up", "v7", check=3)
    assert f"a redirect to {elsewhere.url}/api/v0/instances/7/" in up.stderr
    listed = orch("instances", check=3)
    assert f"vast $ORCH_TEST_VAST_KEY @ {api.url}: error: vast instances: {api.url}/api/v" in listed.stdout
    assert f"a redirect to {elsewhere.url}" in listed.stdout
    assert "1 of 1 provider accounts could not be listed" in listed.stderr
    assert api.seen and all(h["Authorization"] == f"Bearer {TOKEN}" for _, _, h in api.seen)
    assert elsewhere.seen == []
    assert TOKEN not in up.stdout + up.stderr + listed.stdout + listed.stderr


def test_plain_http_to_another_machine_is_refused_when_added_and_when_called(orch: Orch) -> None:
    added = orch("hosts", "add", "v8", "--provider", "vast", "--instance", "8", "--token-env", "K",
                 "--api-url", "http://203.0.113.5:8080", check=2)
    assert "invalid --api-url: plain http to 203.0.113.5 would send the token unencrypted" in added.stderr
    assert not (orch.home / "hosts" / "v8.json").exists()
    orch("hosts", "add", "v8", "--provider", "vast", "--instance", "8", "--token-env", "K",
         "--api-url", "http://127.0.0.1:9")
    entry = orch.home / "hosts" / "v8.json"  # an entry written by an older orch, or by hand
    entry.write_text(entry.read_text().replace("http://127.0.0.1:9", "http://203.0.113.5:8080"))
    up = orch("up", "v8", env={"K": TOKEN}, check=2)
    assert "plain http to 203.0.113.5 would send the token unencrypted" in up.stderr
    listed = orch("instances", "--provider", "vast", "--token-env", "K", "--api-url", "http://203.0.113.5",
                  env={"K": TOKEN}, check=2)
    assert "invalid --api-url: plain http to 203.0.113.5" in listed.stderr
    rented = orch("rent", "g", "--provider", "vast", "--gpu", "RTX_4090", "--token-env", "K", "--yes",
                  "--api-url", "http://203.0.113.5", env={"K": TOKEN}, check=2)
    assert "plain http to 203.0.113.5 would send the token unencrypted" in rented.stderr
    assert not (orch.home / "hosts" / "g.json").exists()
