"""orch's ``ORCH_*`` settings have one home per side and one page of docs:

- no module but ``orchestrator/settings.py`` and ``remote_payload/contract/settings.py`` reads an
  ``ORCH_`` variable from the process environment (read from the code's syntax tree);
- docs/configuration.md has a row for each setting with its default, for each variable orch
  gives a job, for the renamed names, and names no variable orch does not have;
- a setting is read when used; an unreadable value is exit 2 naming it (the CLI and the API),
  before anything connects; an old name still works, with one ``warning:`` line, and its value
  is the one a real SSH connection uses.
"""

from __future__ import annotations

import ast
import re
import socket
import threading
import warnings
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator import settings
from orchestrator.errors import HostError, SettingError
from orchestrator.hosts.inventory import Host
from remote_payload.contract import settings as server_settings
from tests.support.orch import Orch

REPO = Path(__file__).resolve().parents[1]
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
HOMES = {REPO / "orchestrator" / "settings.py", REPO / "remote_payload" / "contract" / "settings.py"}


def _is_environ(node: ast.expr) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _orch_literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("ORCH_")


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of each read of an ``ORCH_`` variable from the process environment:
    ``os.environ.get/pop/setdefault("ORCH_X")``, ``os.environ["ORCH_X"]``, ``os.getenv("ORCH_X")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and _orch_literal(node.args[0]):
            func = node.func
            if isinstance(func, ast.Attribute) and (
                    (func.attr in ("get", "pop", "setdefault") and _is_environ(func.value)) or func.attr == "getenv"):
                found.append((node.lineno, node.args[0].value))  # type: ignore[attr-defined]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value) \
                and _orch_literal(node.slice):
            found.append((node.lineno, node.slice.value))  # type: ignore[attr-defined]
    return found


def test_the_scan_finds_each_way_of_reading_the_environment() -> None:
    code = ('import os\nfrom os import environ\na = os.environ.get("ORCH_A", "1")\nb = os.environ["ORCH_B"]\n'
            'c = os.getenv("ORCH_C")\nd = environ.pop("ORCH_D", None)\nenv = {}\nenv["ORCH_E"] = "set, not read"\n')
    assert environment_reads(ast.parse(code)) == [(3, "ORCH_A"), (4, "ORCH_B"), (5, "ORCH_C"), (6, "ORCH_D")]


def test_only_the_two_settings_modules_read_orch_variables_from_the_environment() -> None:
    reads = [f"{path.relative_to(REPO)}:{line}: {name}"
             for package in ("orchestrator", "remote_payload") for path in sorted((REPO / package).rglob("*.py"))
             if path not in HOMES for line, name in environment_reads(ast.parse(path.read_text(), str(path)))]
    assert reads == [], "read these through orchestrator/settings.py or remote_payload/contract/settings.py"
    home_reads = environment_reads(ast.parse((REPO / "orchestrator" / "settings.py").read_text()))
    assert home_reads == [], "settings.py reads by a Setting's name, never a literal of its own"


def _rows(text: str) -> dict[str, list[str]]:
    """First cell (a `` `NAME` ``) -> the row's other cells, for every table row of ``text``."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `ORCH_") and len(cells) >= 2:
            rows.setdefault(cells[0].strip("`"), cells[1:])
    return rows


def test_configuration_md_has_every_setting_with_its_default_and_nothing_else() -> None:
    rows = _rows(CONFIGURATION)
    for setting in settings.ALL:
        if setting.for_tests:
            assert f"`{setting.name}=" in CONFIGURATION, setting.name
            continue
        assert setting.name in rows, f"docs/configuration.md lacks a row for {setting.name}"
        shown = rows[setting.name][0].replace("`", "")
        assert shown == (setting.shown_default or "(off)"), (setting.name, shown, setting.shown_default)
        for old in setting.old:
            assert rows.get(old, [""])[0] == f"`{setting.name}`", f"the Renamed table lacks {old}"
    server = [server_settings.LEASE_STALL, server_settings.METRICS_FROM_LOG, *server_settings.JOB_VARIABLES]
    assert set(server) <= set(rows), set(server) - set(rows)
    assert rows[server_settings.LEASE_STALL][0] == f"`{server_settings.LEASE_STALL_DEFAULT_S:g}`"
    known = {s.name for s in settings.ALL} | {o for s in settings.ALL for o in s.old} | set(server)
    assert set(re.findall(r"ORCH_[A-Z0-9_]*[A-Z0-9]", CONFIGURATION)) <= known


def test_a_setting_is_read_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_LOST_AFTER_S", raising=False)
    assert settings.LOST_AFTER.seconds() == 600.0
    monkeypatch.setenv("ORCH_LOST_AFTER_S", "0")  # 0 is allowed for this one: lost at the first failure
    assert settings.LOST_AFTER.seconds() == 0.0
    monkeypatch.setenv("ORCH_LOST_AFTER_S", "  ")  # set and empty: the default
    assert settings.LOST_AFTER.seconds() == 600.0
    monkeypatch.setenv("ORCH_HOLD_IDLE_S", "42")
    monkeypatch.delenv("ORCH_HOLD_SPARE_S", raising=False)
    assert settings.hold_spare_s() == 42.0  # the spare's default is the holder's idle time
    monkeypatch.setenv("ORCH_NOTIFY", "Yes")
    assert settings.NOTIFY.on() is True


@pytest.mark.parametrize(("name", "value", "takes"), [
    ("ORCH_CONNECT_TIMEOUT_S", "ten", "a number of seconds"),
    ("ORCH_KEEPALIVE_S", "0", "a number of seconds"),
    ("ORCH_LOST_AFTER_S", "-1", "a number of seconds, at least 0"),
    ("ORCH_STOCK_DELAY_S", "inf", "a number of seconds"),
    ("ORCH_LARGE_WORKSPACE_MB", "1.5", "a whole number of megabytes"),
    ("ORCH_CONNECT_ATTEMPTS", "0", "a whole number, at least 1"),
    ("ORCH_HOLD", "maybe", "1 or 0"),
])
def test_an_unreadable_value_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                     takes: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=re.escape(f"{name}={value!r} in the environment: it takes {takes}")) as err:
        settings.check_all()
    assert err.value.exit_code == 2


def test_the_cli_and_the_api_refuse_an_unreadable_value_before_anything_starts(
        orch: Orch, monkeypatch: pytest.MonkeyPatch) -> None:
    done = orch("status", env={"ORCH_CONNECT_TIMEOUT_S": "ten"}, check=2)
    assert done.stderr == ("error: ORCH_CONNECT_TIMEOUT_S='ten' in the environment: it takes a number of seconds, "
                           "e.g. 30 or 0.5; unset it for the default (10)\n")
    assert orch("exec", "local", "--", "true", env={"ORCH_HOLD": "maybe"}, check=2).stderr.startswith(
        "error: ORCH_HOLD='maybe' in the environment: it takes 1 or 0")  # a command outside the warm server too
    from orchestrator.api import Orch as Api

    monkeypatch.setenv("ORCH_UP_TIMEOUT_S", "soon")
    with pytest.raises(SettingError, match="ORCH_UP_TIMEOUT_S='soon'"):
        Api(home=orch.home)


def test_the_old_name_works_and_warns_once(orch: Orch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_CONNECT_TIMEOUT_S", raising=False)
    monkeypatch.setenv("ORCH_CONNECT_TIMEOUT", "7")
    settings._WARNED.discard("ORCH_CONNECT_TIMEOUT")
    with pytest.warns(settings.RenamedSetting, match="ORCH_CONNECT_TIMEOUT is now called ORCH_CONNECT_TIMEOUT_S"):
        assert settings.CONNECT_TIMEOUT.seconds() == 7.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second read says nothing more
        assert settings.CONNECT_TIMEOUT.seconds() == 7.0
    monkeypatch.setenv("ORCH_CONNECT_TIMEOUT_S", "9")  # the new name wins, silently
    assert settings.CONNECT_TIMEOUT.seconds() == 9.0

    env = {k: v for k, v in orch.env.items() if k != "ORCH_CONNECT_TIMEOUT_S"}
    done = orch.__class__(orch.home, orch.remote_root, {**env, "ORCH_CONNECT_TIMEOUT": "7"}, orch.cwd)("status")
    warned = [line for line in done.stderr.splitlines() if "ORCH_CONNECT_TIMEOUT" in line]
    assert warned == ["warning: ORCH_CONNECT_TIMEOUT is now called ORCH_CONNECT_TIMEOUT_S; ORCH_CONNECT_TIMEOUT "
                      "still works for now, set ORCH_CONNECT_TIMEOUT_S instead"]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts and never says a word (an SSH server that hangs before its banner)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_the_old_names_value_is_what_a_real_connection_uses(silent_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.transport import ssh

    monkeypatch.delenv("ORCH_CONNECT_TIMEOUT_S", raising=False)
    monkeypatch.setenv("ORCH_CONNECT_TIMEOUT", "0.3")
    monkeypatch.setenv("ORCH_CONNECT_ATTEMPTS", "2")
    settings._WARNED.discard("ORCH_CONNECT_TIMEOUT")
    timeouts: list[float] = []
    real = socket.create_connection

    def spy(address: tuple[str, int], timeout: float, *rest: object, **kw: object) -> socket.socket:
        timeouts.append(timeout)
        return real(address, timeout, *rest, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ssh.socket, "create_connection", spy)
    host = Host(name="silent", address="127.0.0.1", port=silent_port, user="root")
    with pytest.warns(settings.RenamedSetting), pytest.raises(HostError, match=r"cannot reach silent .*tried 2 times"):
        ssh.SSHTransport(host)
    assert timeouts == [0.3, 0.3]


def test_the_server_side_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_LEASE_STALL_S", raising=False)
    assert server_settings.lease_stall_s() == 30.0
    monkeypatch.setenv("ORCH_LEASE_STALL_S", "2.5")
    assert server_settings.lease_stall_s() == 2.5
    monkeypatch.setenv("ORCH_LEASE_STALL_S", "-3")
    with pytest.raises(ValueError, match=r"ORCH_LEASE_STALL_S='-3' in the server's environment: it takes a number"):
        server_settings.lease_stall_s()
    assert server_settings.metrics_from_log({}) is True
    assert server_settings.metrics_from_log({"ORCH_METRICS_FROM_LOG": " Off"}) is False
