"""``orch tunnel``'s PORT words and --local ports (orchestrator/tunnel/ports.py)."""

from __future__ import annotations

import pytest

from orchestrator.errors import UsageError
from orchestrator.tunnel.ports import Forward, parse
from tests.support.orch import Orch


def test_ports_pair_with_local_ports_in_order_and_name_the_address_the_box_reaches() -> None:
    assert parse(["6006", "db.internal:5432", "[::1]:8888"], [0, 15432]) == [
        Forward(None, 6006, 0), Forward("db.internal", 5432, 15432), Forward("::1", 8888, 8888)]
    assert [f.far("node7") for f in parse(["6006", "[::1]:8888"], [])] == ["node7:6006", "[::1]:8888"]


@pytest.mark.parametrize(("words", "local", "said"), [
    (["0"], [], "'0' is not a port number"),
    (["x:70000"], [], "'70000' is not a port number"),
    ([":80"], [], "needs a host before the colon"),
    (["80"], [1, 2], "2 --local ports for 1 port(s)"),
    (["80", "81"], [9000, 9000], "local port 9000 is asked for twice"),
    (["80", "8080"], [8080], "local port 8080 is asked for twice"),
    (["80"], [70000], "--local 70000 is not a port number"),
])
def test_what_cannot_be_forwarded_is_refused_with_the_word_that_is_wrong(
        words: list[str], local: list[int], said: str) -> None:
    with pytest.raises(UsageError, match=None) as refused:
        parse(words, local)
    assert said in str(refused.value)


def test_launch_ports_out_of_range_or_twice_are_refused_at_their_line(orch: Orch) -> None:
    spec = orch.cwd / "job.yaml"
    (orch.cwd / "ws").mkdir()
    base = "name: web\nhosts: [local]\nworkspace: {path: ws}\nlaunch:\n  command: python -m http.server 6006\n"
    spec.write_text(base + "  ports: [6006, 6006]\n")
    twice = orch("check", "job.yaml", check=2).stderr
    assert "job.yaml:6:" in twice and "launch.ports: port 6006 is listed more than once" in twice
    spec.write_text(base + "  ports:\n    - 6006\n    - 65536\n")
    wide = orch("check", "job.yaml", check=2).stderr
    assert "job.yaml:8:" in wide and "launch.ports.1: must be an integer from 1 to 65535 (got 65536)" in wide
    spec.write_text(base + "  ports: [6006]\n")
    orch("check", "job.yaml")
