"""``orch tunnel`` to an AutoDL host (a password login) against the stand-in: the tunnel follows a
power cycle to the new port and password the provider gives, by itself."""

from __future__ import annotations

from pathlib import Path

from tests.support.orch import Orch
from tests.support.standin.autodl import AutoDLStandin
from tests.support.tunnel import Running, Served, fetched

TOKEN_ENV = "ORCH_TEST_AUTODL_TOKEN"


def test_a_tunnel_connects_again_at_the_new_endpoint_after_a_power_cycle(
        orch: Orch, autodl: AutoDLStandin, tmp_path: Path) -> None:
    orch.env[TOKEN_ENV] = autodl.token
    uuid = list(autodl.boxes)[0]
    box = autodl.boxes[uuid]
    orch("hosts", "add", "t1", "--provider", "autodl", "--instance", uuid, "--token-env", TOKEN_ENV,
         "--api-url", autodl.url, "--python", "/usr/bin/python3")
    orch("up", "t1", "--trust")
    served = Served(tmp_path / "served", "behind a power cycle")  # on loopback: the box reaches it as localhost
    tunnel = Running(orch, "tunnel", "t1", str(served.port), "--local", "0")
    try:
        (url, _), = tunnel.urls()
        fetched(f"{url}/token.txt", served.token)
        assert f"forwarding through t1 ({box.user}@127.0.0.1:{box.port})" in tunnel.stderr
        first = (box.port, box.password)

        orch("down", "t1")
        tunnel.said("the connection to t1 was lost")
        tunnel.said("is shutdown; power it on with `orch up t1`")  # the provider's word, said once, tried again
        orch("up", "t1")
        assert box.port != first[0] and box.password != first[1]
        tunnel.said(f"connected again to t1 ({box.user}@127.0.0.1:{box.port})")
        fetched(f"{url}/token.txt", served.token)
        assert tunnel.interrupt() == 130
        for secret in (autodl.token, first[1], box.password):
            assert secret not in tunnel.stdout + tunnel.stderr
    finally:
        tunnel.stop()
        served.close()
        orch("down", "t1")
