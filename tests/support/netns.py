"""Test hosts in network namespaces: a bridge, one namespace per node with its own address,
hostname (``unshare --uts``), ``/etc/hosts`` (``/etc/netns/<ns>/hosts``) and sshd on port 22.
Loopback-free, machine-local addresses only; everything is removed by ``teardown``."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.sshd import SSHD, keygen
from tests.support.tiers import need


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def free_subnet(start: int, first: int) -> str:
    """A 10.a.b.0/24 that no interface here uses (other test processes build bridges too), from
    10.<first..first+49>.<100..149>, looked for from ``start`` (a pid: each process its own order)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    nets = [ipaddress.ip_interface(a).network for a in re.findall(r"inet (\S+)", used)]
    for i in range(2500):
        n = (start + i) % 2500
        subnet = f"10.{first + n // 50}.{n % 50 + 100}"
        net = ipaddress.ip_network(f"{subnet}.0/24")
        if not any(net.overlaps(other) for other in nets):
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet")


@dataclass
class Node:
    name: str
    ns: str
    address: str
    host_key_line: str
    proc: subprocess.Popen


@dataclass
class Cluster:
    tag: str
    bridge: str
    workdir: Path
    client_key: Path
    nodes: list[Node] = field(default_factory=list)

    def teardown(self) -> None:
        for node in self.nodes:
            subprocess.run(["ip", "netns", "pids", node.ns], capture_output=True)
            pids = subprocess.run(["ip", "netns", "pids", node.ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", node.ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{node.ns}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_cluster(workdir: Path, count: int = 2) -> Cluster:
    """``count`` nodes named node1..nodeN at 10.<a>.<b>.11.. on a fresh bridge (test tier ``netns``)."""
    need("netns", "start_cluster")
    tag = f"{os.getpid() % 10000:04d}"
    subnet = free_subnet(os.getpid(), 200)  # 10.200-249.*: not Slurm's clusters' 10.150-199.*
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    client_key = workdir / "client_ed25519"
    keygen(client_key)
    auth = workdir / "authorized_keys"
    auth.write_text(Path(str(client_key) + ".pub").read_text())
    auth.chmod(0o644)
    cluster = Cluster(tag, f"orchbr{tag}", workdir, client_key)
    try:
        sh("ip", "link", "add", cluster.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{subnet}.1/24", "dev", cluster.bridge)
        sh("ip", "link", "set", cluster.bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{subnet}.{10 + i} node{i}\n" for i in range(1, count + 1))
        for i in range(1, count + 1):
            ns, veth, addr = f"orchn{tag}{i}", f"orv{tag}{i}", f"{subnet}.{10 + i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "b")
            sh("ip", "link", "set", veth + "b", "master", cluster.bridge, "up")
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts)
            key = workdir / f"host{i}_ed25519"
            keygen(key)
            config = workdir / f"sshd{i}_config"
            config.write_text(
                f"Port 22\nListenAddress {addr}\nHostKey {key}\nPidFile {workdir}/sshd{i}.pid\n"
                f"AuthorizedKeysFile {auth}\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n"
                "PasswordAuthentication no\nLogLevel ERROR\nMaxStartups 100:30:200\nMaxSessions 100\n"
            )
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                 f'hostname node{i} && exec {SSHD} -D -e -f "$0"', str(config)],
                stdout=subprocess.DEVNULL, stderr=open(workdir / f"sshd{i}.log", "ab"))
            kind, b64 = Path(str(key) + ".pub").read_text().split()[:2]
            cluster.nodes.append(Node(f"node{i}", ns, addr, f"{kind} {b64}", proc))
        for node in cluster.nodes:
            deadline = time.time() + 10
            while True:
                try:
                    socket.create_connection((node.address, 22), timeout=0.5).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise RuntimeError(f"sshd in {node.ns} did not start")
                    time.sleep(0.1)
    except BaseException:
        cluster.teardown()
        raise
    return cluster
