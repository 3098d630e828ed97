"""A private, real Slurm cluster for tests (Debian's ``slurmctld``/``slurmd``/``slurm-client``
and ``munge``), everything under one temp dir and removed by ``teardown``.

* its own munge key and ``munged`` socket (``AuthInfo=socket=...``), so the machine's
  ``/etc/munge`` and ``/etc/slurm`` are never read or touched;
* its own ``slurm.conf``: a cluster name unique to the run, free non-default ports, state,
  spool, log and pid files under the temp dir, ``SlurmUser=root``, no cgroups
  (``proctrack/linuxproc``, ``task/none``; slurmd still insists on loading a cgroup plugin,
  so each slurmd gets a private empty tmpfs on /sys/fs/cgroup and ``cgroup/v1``: the host's
  cgroup v1/v2/systemd layout does not matter), ``select/cons_tres`` with ``CR_Core``, no
  accounting database (``sacct`` does not work: see ``SACCT_DISABLED``), batch jobs
  scheduled at once (``batch_sched_delay=0``), ended jobs kept ``MinJobAge=300`` s;
* nodes whose CPUs/memory are what ``slurmd -C`` reports (or ``cpus=N`` faked with
  ``SlurmdParameters=config_overrides``), optionally ``gpus=N`` fake ``gpu`` gres: character
  devices ``<dir>/dev/gpu<i>`` (/dev/null's numbers) in ``gres.conf``, so ``--gres=gpu:N`` is
  scheduled and steps see ``CUDA_VISIBLE_DEVICES``/``SLURM_STEP_GPUS``.

Two layouts: ``start_slurm(dir)`` runs slurmctld and one slurmd on this machine (node name
= the machine's short hostname, address 127.0.0.1); ``start_slurm(dir, netns=2)`` keeps
slurmctld here and runs one slurmd per network namespace (own address on a fresh bridge,
own hostname ``node1``, ``node2``... via ``unshare --uts``, own ``/etc/hosts``), the file
system shared as on a real cluster. Clients find the cluster through ``SLURM_CONF``
(``cluster.env``), or through the wrappers in ``cluster.bin`` (put it first on ``PATH``).

Slurm's job processes outlive a stopped ``slurmd`` (``slurmstepd`` detaches), so
``teardown`` cancels every job, stops the daemons, then kills whatever still carries this
cluster's ``SLURM_CONF`` or ``SLURM_CLUSTER_NAME`` in its environment (and everything in
the namespaces)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.support.netns import free_subnet
from tests.support.poll import wait_until
from tests.support.sshd import free_port
from tests.support.tiers import need

WAIT_S = 120  # what a test waits for Slurm on a loaded 2-core machine

CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sstat")
DAEMONS = ("munged", "slurmctld", "slurmd")
# What `sacct` prints (rc 1) on these clusters: there is no slurmdbd, by design.
SACCT_DISABLED = "Slurm accounting storage is disabled"
# JobStates of a job that has ended (scontrol show job / squeue -t all).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")
_counter = itertools.count(1)


def available() -> str | None:
    """None when the Slurm and munge programs are installed, else what is missing."""
    missing = [p for p in (*DAEMONS, *CLIENTS, "munge") if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    return f"missing {', '.join(missing)} (scripts/test.sh installs slurmctld slurmd slurm-client munge)" \
        if missing else None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _sh(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def hardware() -> dict[str, int]:
    """This machine as ``slurmd -C`` sees it: CPUs, Boards, SocketsPerBoard, ..., RealMemory."""
    out = subprocess.run([_exe("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", out.splitlines()[0])}


@dataclass
class SlurmNode:
    name: str
    address: str
    ns: str | None = None  # network namespace (None: this machine's)
    proc: subprocess.Popen | None = None


@dataclass
class SlurmCluster:
    workdir: Path
    name: str  # ClusterName, unique per run
    conf: Path
    ctl_port: int
    slurmd_port: int
    nodes: list[SlurmNode]
    partitions: list[str]
    gpus: int  # fake gpu gres per node (0: none)
    cpus: int  # CPUs per node
    bridge: str | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What clients (sbatch, srun, squeue, ...) need on top of the usual environment."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def bin(self) -> Path:
        """Wrappers ``sbatch``, ``squeue``, ... that set ``SLURM_CONF``; for a login shell's PATH."""
        return self.workdir / "bin"

    @property
    def logdir(self) -> Path:
        return self.workdir / "log"

    # --- clients -----------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 60, input: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``sbatch ...``) against this cluster."""
        proc = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, input=input, cwd=cwd)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                                 f"--- stderr\n{proc.stderr}")
        return proc

    def sbatch(self, script: str, *args: str, cwd: Path | None = None) -> str:
        """Submit ``script`` (text, on stdin); return the job id."""
        out = self.run("sbatch", "--parsable", *args, input=script, cwd=cwd or self.workdir).stdout.strip()
        return out.split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Reason, NodeList, ExitCode, ...);
        {} once Slurm has forgotten the job (MinJobAge after it ended)."""
        proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait_job(self, job_id: str, states: tuple[str, ...] = ENDED, timeout: float = 60) -> dict[str, str]:
        """Poll until the job's JobState is one of ``states``; AssertionError (with the
        job and the daemons' logs) at the deadline."""
        seen: list[dict[str, str]] = [{}]

        def reached() -> dict[str, str] | None:
            seen[0] = self.job(job_id)
            return seen[0] if seen[0].get("JobState") in states else None
        return wait_until(reached, what=f"job {job_id} in {states}", timeout=timeout,
                          detail=lambda: f"{seen[0]}\n{self.logs_tail()}")

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every node is ``idle`` (registered, nothing running): start-up and between tests."""
        want = {n.name for n in self.nodes}

        def idle() -> dict[str, str] | None:
            self._check_alive()
            states = self.node_states()
            return states if set(states) == want and all(s == "idle" for s in states.values()) else None

        def nodes() -> str:
            shown = self.run("scontrol", "show", "node", "-o", check=False)
            return f"{self.node_states()}\n{shown.stdout}{shown.stderr}\n{self.logs_tail()}"
        _cluster_wait(lambda: wait_until(idle, what="every Slurm node to be idle", timeout=timeout, interval=0.2,
                                         detail=nodes))

    def cancel_all(self) -> None:
        ids = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
        if ids:
            self.run("scancel", *ids, check=False)

    # --- diagnostics -------------------------------------------------------------------
    def logs_tail(self, lines: int = 25) -> str:
        parts = []
        for path in sorted(self.logdir.glob("*")):
            log = path.with_suffix(".log")
            if path.suffix == ".out" and log.exists() and log.stat().st_size:
                continue  # the daemon's stderr, a copy of its log file
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}\n{self.logs_tail()}")

    # --- teardown ----------------------------------------------------------------------
    def teardown(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.cancel_all()
            except Exception:
                pass
        order = [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            if name in self.procs:
                _stop(self.procs[name])
        for _ in range(3):  # job processes (slurmstepd and tasks) outlive slurmd
            if not self._kill_strays():
                break
            time.sleep(0.2)
        for node in self.nodes:
            if node.ns:
                _kill_netns(node.ns)
                subprocess.run(["ip", "netns", "del", node.ns], capture_output=True)
                shutil.rmtree(f"/etc/netns/{node.ns}", ignore_errors=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill_strays(self) -> int:
        marks = (f"SLURM_CONF={self.conf}".encode(), f"SLURM_CLUSTER_NAME={self.name}".encode())
        mine = {os.getpid(), os.getppid()}
        killed = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine:
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(m in env for m in marks):
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        return killed


@dataclass
class SlurmLogin:
    """The loopback sshd (tests/support/sshd.py) as the cluster's login node, as orch's Slurm backend
    will reach it: ``ssh root@127.0.0.1``, with ``cluster.bin`` first on PATH (sshd does
    not pass ``SLURM_CONF`` on, and the machine has no /etc/slurm/slurm.conf)."""

    port: int
    client_key: Path
    cluster: SlurmCluster

    @property
    def ssh(self) -> list[str]:
        return ["ssh", "-p", str(self.port), "-i", str(self.client_key), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "root@127.0.0.1"]

    @property
    def prefix(self) -> str:
        """What a remote command needs in front to find this cluster."""
        return f"export PATH={self.cluster.bin}:$PATH SLURM_CONF={self.cluster.conf};"

    def __call__(self, command: str, check: bool = True, timeout: float = 60,
                 input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.ssh, f"{self.prefix} {command}"], capture_output=True, text=True,
                              timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {command!r} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                                 f"--- stderr\n{proc.stderr}")
        return proc


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _kill_netns(ns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def _partition_lines(partitions: dict[str, str] | None) -> list[str]:
    """``{"debug": "", "long": "MaxTime=60"}`` → PartitionName lines: Nodes=ALL and
    State=UP unless given, the first one Default=YES unless some partition says Default."""
    partitions = partitions if partitions is not None else {"debug": ""}
    any_default = any("Default=" in opts for opts in partitions.values())
    lines = []
    for i, (name, opts) in enumerate(partitions.items()):
        words = opts.split()
        if not any(w.startswith("Nodes=") for w in words):
            words.append("Nodes=ALL")
        if not any(w.startswith("State=") for w in words):
            words.append("State=UP")
        if i == 0 and not any_default:
            words.append("Default=YES")
        lines.append(f"PartitionName={name} " + " ".join(words))
    return lines


def start_slurm(workdir: Path | None = None, netns: int = 0, partitions: dict[str, str] | None = None,
                gpus: int = 0, cpus: int | None = None, extra_conf: str = "", timeout: float = 90) -> SlurmCluster:
    """Start a Slurm cluster under ``workdir`` (a fresh /tmp dir when None; keep it short:
    munge's and slurmd's sockets live below it) and return once every node is idle.
    ``netns=0``: one slurmd on this machine; ``netns=N``: N slurmds in network namespaces,
    nodes ``node1..nodeN``. ``partitions``: name → extra ``PartitionName`` options (default:
    one partition ``debug``). ``gpus``: fake gpu gres per node. ``cpus``: CPUs per node
    instead of the real ones (the configuration overrides the hardware). ``extra_conf``:
    lines appended to slurm.conf (a later key wins, e.g. ``MinJobAge=5``). A start that
    fails raises RuntimeError with the daemons' logs, having cleaned up. The test tiers ``slurm``
    (and ``netns`` for ``netns=N``): tests/support/tiers.py."""
    need("slurm", "start_slurm")
    if netns:
        need("netns", f"start_slurm(netns={netns})")
    for attempt in range(3):
        try:
            return _start(workdir, netns, partitions, gpus, cpus, extra_conf, timeout)
        except RuntimeError as e:  # a free port taken between free_port() and the daemon's bind
            if "Address already in use" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _start(workdir: Path | None, netns: int, partitions: dict[str, str] | None, gpus: int, cpus: int | None,
           extra_conf: str, timeout: float) -> SlurmCluster:
    workdir = Path(workdir or tempfile.mkdtemp(prefix="orch-slurm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # jobs of plain users read the config and write below their own dirs
    if len(str(workdir / "munge" / "munge.socket")) > 100:
        raise ValueError(f"{workdir} is too long a path for the cluster's unix sockets")
    seq = next(_counter)
    tag = f"{os.getpid() % 10000:04d}{seq % 100:02d}"  # interface names: 15 characters at most
    hw = hardware()
    cluster = SlurmCluster(workdir, f"orch{os.getpid()}x{seq}", workdir / "slurm.conf", free_port(), free_port(), [],
                           _partition_lines(partitions), gpus, cpus or hw["CPUs"])
    try:
        for sub in ("log", "state", "spool", "run", "munge", "bin", "dev"):
            (workdir / sub).mkdir(mode=0o755, exist_ok=True)
        if netns:
            subnet = free_subnet(os.getpid(), 150)  # 10.150-199.*: not netns.py's 10.200-249.*
            ctl_addr = f"{subnet}.1"
            cluster.bridge = f"slbr{tag}"
            cluster.nodes = [SlurmNode(f"node{i}", f"{subnet}.{10 + i}", f"orchsl{tag}{i}") for i in range(1, netns + 1)]
        else:
            ctl_addr = "127.0.0.1"
            cluster.nodes = [SlurmNode(short_hostname(), "127.0.0.1")]
        for node in cluster.nodes:
            (workdir / "spool" / node.name).mkdir(mode=0o755, exist_ok=True)
        _write_munge_key(workdir / "munge" / "munge.key")
        _write_conf(cluster, hw, ctl_addr, extra_conf)
        for client in CLIENTS:
            wrapper = cluster.bin / client
            wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={cluster.conf} exec {_exe(client)} "$@"\n')
            wrapper.chmod(0o755)
        (workdir / "env.sh").write_text(f"export SLURM_CONF={cluster.conf}\n")
        if netns:
            _build_netns(cluster, ctl_addr)
        _start_daemons(cluster, timeout)
        cluster.wait_idle(timeout)
    except BaseException:
        cluster.teardown()
        raise
    return cluster


def _write_munge_key(path: Path) -> None:
    path.write_bytes(os.urandom(1024))
    path.chmod(0o400)


def _write_conf(c: SlurmCluster, hw: dict[str, int], ctl_addr: str, extra_conf: str) -> None:
    w = c.workdir
    if c.cpus != hw["CPUs"]:
        shape = f"CPUs={c.cpus} Sockets=1 CoresPerSocket={c.cpus} ThreadsPerCore=1"
    else:
        shape = (f"CPUs={hw['CPUs']} Boards={hw['Boards']} SocketsPerBoard={hw['SocketsPerBoard']} "
                 f"CoresPerSocket={hw['CoresPerSocket']} ThreadsPerCore={hw['ThreadsPerCore']}")
    gres = f" Gres=gpu:{c.gpus}" if c.gpus else ""
    nodes = "\n".join(f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} {shape} "
                      f"RealMemory={hw['RealMemory']}{gres} State=UNKNOWN" for n in c.nodes)
    partitions = "\n".join(c.partitions)
    c.conf.write_text(f"""\
# A test cluster of orch's tests (tests/support/slurm.py); everything lives in {w}
ClusterName={c.name}
SlurmctldHost={short_hostname()}({ctl_addr})
SlurmctldPort={c.ctl_port}
SlurmdPort={c.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={w}/munge/munge.socket
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool/%n
SlurmctldPidFile={w}/run/slurmctld.pid
SlurmdPidFile={w}/run/slurmd-%n.pid
SlurmctldLogFile={w}/log/slurmctld.log
SlurmdLogFile={w}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=300
SchedulerParameters=batch_sched_delay=0
{"SlurmdParameters=config_overrides" if c.cpus != hw["CPUs"] else ""}
{"GresTypes=gpu" if c.gpus else ""}
{nodes}
{partitions}
{extra_conf}
""")
    (w / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    if c.gpus:
        files = []
        for i in range(c.gpus):
            dev = w / "dev" / f"gpu{i}"  # slurmd wants a device file: /dev/null's numbers
            os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
            files.append(str(dev))
        (w / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={n.name} Name=gpu File={f}\n" for n in c.nodes for f in files))


def _build_netns(c: SlurmCluster, ctl_addr: str) -> None:
    _sh("ip", "link", "add", c.bridge, "type", "bridge")
    _sh("ip", "addr", "add", f"{ctl_addr}/24", "dev", c.bridge)
    _sh("ip", "link", "set", c.bridge, "up")
    hosts = f"127.0.0.1 localhost\n{ctl_addr} {short_hostname()}\n" + "".join(f"{n.address} {n.name}\n" for n in c.nodes)
    for i, node in enumerate(c.nodes, 1):
        veth = f"slv{c.bridge[4:]}{i}"
        _sh("ip", "netns", "add", node.ns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "b")
        _sh("ip", "link", "set", veth + "b", "master", c.bridge, "up")
        _sh("ip", "link", "set", veth, "netns", node.ns)
        _sh("ip", "-n", node.ns, "addr", "add", f"{node.address}/24", "dev", veth)
        _sh("ip", "-n", node.ns, "link", "set", veth, "up")
        _sh("ip", "-n", node.ns, "link", "set", "lo", "up")
        Path(f"/etc/netns/{node.ns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{node.ns}/hosts").write_text(hosts)


def _spawn(c: SlurmCluster, key: str, argv: list[str]) -> subprocess.Popen:
    with open(c.logdir / f"{key}.out", "ab") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **c.env}, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    c.procs[key] = proc
    return proc


def _cluster_wait(wait: Callable[[], object]) -> None:
    """Run ``wait``, a wait for the cluster's daemons: a start that times out raises
    RuntimeError (what ``start_slurm`` promises), not a test's AssertionError."""
    try:
        wait()
    except AssertionError as e:
        raise RuntimeError(str(e)) from None


def _wait(c: SlurmCluster, what: str, ready: Callable[[], bool], timeout: float) -> None:
    """Until ``ready()``; RuntimeError, with the daemons' logs, once a daemon exits or after ``timeout``."""
    def up() -> bool:
        c._check_alive()
        return ready()
    _cluster_wait(lambda: wait_until(up, what=f"{what} to be ready", timeout=timeout, detail=c.logs_tail))


def _start_daemons(c: SlurmCluster, timeout: float) -> None:
    w = c.workdir
    sock = w / "munge" / "munge.socket"
    _spawn(c, "munged", [_exe("munged"), "--foreground", f"--socket={sock}", f"--key-file={w}/munge/munge.key",
                         f"--pid-file={w}/munge/munged.pid", f"--seed-file={w}/munge/munged.seed",
                         f"--log-file={w}/log/munged.log", "--num-threads=4"])
    _wait(c, "munged", sock.exists, timeout)
    _spawn(c, "slurmctld", [_exe("slurmctld"), "-D", "-f", str(c.conf)])
    _wait(c, "slurmctld", lambda: "is UP" in c.run("scontrol", "ping", check=False).stdout, timeout)
    for node in c.nodes:
        # A private mount namespace with an empty tmpfs on /sys/fs/cgroup and
        # CgroupPlugin=cgroup/v1 (cgroup.conf): slurmd 22.05 always initialises a cgroup
        # plugin, and the host's cgroups (v1, v2 wanting systemd over dbus, or no /sys/fs/cgroup
        # at all after `ip netns exec` remounts /sys) must not matter; nothing uses it
        # (proctrack/linuxproc, task/none).
        script = (f"mount -t tmpfs -o size=1m,mode=755 orch-slurm-cgroup /sys/fs/cgroup && "
                  f"exec {_exe('slurmd')} -D -N {node.name} -f {c.conf}")
        if node.ns:  # own network, hostname and /etc/hosts (from /etc/netns/<ns>/hosts)
            argv = ["ip", "netns", "exec", node.ns, "unshare", "--uts", "sh", "-c", f"hostname {node.name} && {script}"]
        else:
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        node.proc = _spawn(c, f"slurmd-{node.name}", argv)
