"""The SSH data path (orchestrator/transport/ssh.py): AES-GCM where the server offers it, any
cipher paramiko knows where it does not, and channels that announce a large window and packet —
against real OpenSSH servers, with the bytes checked end to end both ways."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.hosts.inventory import Host
from orchestrator.transport.ssh import MAX_PACKET_BYTES, WINDOW_BYTES, SSHTransport
from tests.support.sshd import SSHServer, start_sshd
from tests.support.tiers import needs

SIZE = 24 << 20  # several windows' worth of the server's, a few of ours


@pytest.fixture(scope="module")
@needs("root")
def ctr_only() -> Iterator[SSHServer]:
    """An sshd that offers no GCM cipher (an older or a hardened server)."""
    workdir = Path(tempfile.mkdtemp(prefix="orch-sshd-ctr-"))
    server = start_sshd(workdir, extra="Ciphers aes128-ctr,aes256-ctr\n")
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def host_of(server: SSHServer) -> Host:
    return Host(name="box", address="127.0.0.1", port=server.port, user="root", identity_file=str(server.client_key),
                root="/tmp", host_key=server.host_key_line)


def round_trip(ssh: SSHTransport) -> None:
    """SIZE random bytes up through `sha256sum`, and SIZE bytes down, each checked whole."""
    data = (hashlib.sha256(b"seed").digest() * (SIZE // 32 + 1))[:SIZE]
    up = ssh.run(["sha256sum"], input=data, timeout=120)
    assert up.ok and up.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    down = ssh.run(["head", "-c", str(SIZE), "/dev/urandom"], timeout=120)
    assert down.ok and len(down.stdout) == SIZE


def test_gcm_is_chosen_where_offered_and_channels_announce_a_large_window(sshd: SSHServer) -> None:
    ssh = SSHTransport(host_of(sshd))
    try:
        transport = ssh.client.get_transport()
        assert transport is not None
        assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2
        channel = transport.open_session()
        assert (channel.in_window_size, channel.in_max_packet_size) == (WINDOW_BYTES, MAX_PACKET_BYTES)
        channel.close()
        round_trip(ssh)
    finally:
        ssh.close()


def test_a_server_without_gcm_still_connects_with_another_cipher(ctr_only: SSHServer) -> None:
    ssh = SSHTransport(host_of(ctr_only))
    try:
        transport = ssh.client.get_transport()
        assert transport is not None and transport.remote_cipher == "aes128-ctr"
        round_trip(ssh)
    finally:
        ssh.close()
