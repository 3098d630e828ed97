"""The host inventory under ``ORCH_HOME/hosts/`` and the built-in ``local`` host.

One JSON file (0600) per host. The pinned host key lives in the entry itself, so it belongs
to the inventory name, not to an address that several rented instances may share. Passwords
are never stored: only the name of the environment variable that holds one. A provider host
(``provider``) stores its provider, instance and the name of the token's variable; its address,
port and password come from the provider each time it is connected to
(``orchestrator/access/provisioned.py``), the password in memory only (``live_password``).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.errors import LocalFileError, UsageError
from orchestrator.home import orch_home, write_private
from orchestrator.hosts.apiurl import api_url_problem
from orchestrator.hosts.hostkey import key_line_problem
from orchestrator.providers.registry import NAMES as PROVIDER_NAMES
from remote_payload.contract.slurm import NAME_PATTERN as SLURM_NAME

if TYPE_CHECKING:
    from orchestrator.spec.model import InlineHost

# spec.NAME_RE, repeated so that the inventory does not import the job-file schema (yaml, the
# trainer's config models): commands that only connect start faster. A test keeps them equal.
NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
LOCAL = "local"
DEFAULT_ROOT = "~/orch"
# the providers of providers/registry.py; a Literal, so a wrong name reads "Input should be
# 'autodl', 'vast' or 'runpod'" like every other choice
ProviderName = Literal[PROVIDER_NAMES]  # type: ignore[valid-type]


class ProviderRef(BaseModel):
    """Where a provider host's instance is rented: never the token, only its variable's name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ProviderName
    instance: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    token_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_url: str | None = Field(None, pattern=r"^https?://[^\s]+$",
                                description="The provider's API (default: its own); a proxy or a stand-in.")

    @field_validator("api_url")
    @classmethod
    def _token_goes_only_there(cls, value: str | None) -> str | None:
        problem = api_url_problem(value) if value is not None else None
        if problem:
            raise PydanticCustomError("api_url", problem)
        return value


class SeenEndpoint(BaseModel):
    """Where a provider host's sshd answered last: for the system ssh and VSCode
    (``orch ssh``/``orch code`` write it into the ssh-config block). Never the password; stale
    after a power cycle, renewed by ``orch up``, ``orch ssh`` and ``orch code``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = Field(pattern=r"^[A-Za-z0-9.:_-]{1,255}$")
    port: int = Field(ge=1, le=65535)
    user: str = Field(pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,63}$")


class Host(BaseModel):
    """One inventory entry. ``kind == "local"`` only for the built-in host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_RE)
    kind: Literal["ssh", "local"] = "ssh"
    address: str = ""
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    identity_file: str | None = None
    password_env: str | None = None
    root: str = DEFAULT_ROOT
    python: str = "python3"
    presets: list[str] = Field(default_factory=list)
    host_key: str | None = Field(None, description="Pinned key as '<type> <base64>'.")
    price_per_hour: float | None = Field(
        None, ge=0, description="What the box costs per hour (any currency); `orch status` estimates cost.")
    idle_shutdown_minutes: float | None = Field(
        None, gt=0, description="Power the box off after this long with no orch job running (armed by the "
        "supervisor of the last job to end).")
    gc_keep_days: float | None = Field(
        None, ge=0, description="At the end of each submit, remove what `orch gc HOST --keep-days N --yes` would "
        "(docs/commands.md, Where things live); never fails the submit.")

    scheduler: Literal["none", "slurm"] = Field(
        "none", description="`slurm`: the address is a login node; jobs go through sbatch (docs/slurm.md).")
    partition: str | None = Field(None, pattern=SLURM_NAME, description="Slurm partition (default: the cluster's).")
    account: str | None = Field(None, pattern=SLURM_NAME, description="Slurm account to charge.")
    qos: str | None = Field(None, pattern=SLURM_NAME, description="Slurm quality of service.")
    slurm_env: dict[str, str] = Field(
        default_factory=dict, description="Environment for Slurm's commands on the login node (e.g. SLURM_CONF).")
    provider: ProviderRef | None = Field(
        None, description="A rented instance whose address, port and password the provider gives on each connect.")
    seen: SeenEndpoint | None = Field(
        None, description="A provider host's endpoint when orch last connected for the system ssh (no password).")
    _password: str | None = PrivateAttr(None)

    def live(self, address: str, port: int, user: str, password: str | None) -> "Host":
        """This entry at the endpoint its provider gives now, the password in memory only."""
        host = self.model_copy(update={"address": address, "port": port, "user": user})
        host._password = password
        return host

    @property
    def live_password(self) -> str | None:
        """The provider's password of a ``live`` copy (never stored, never dumped)."""
        return self._password

    @field_validator("slurm_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) or "\0" in val:
                raise ValueError(f"slurm_env: {key!r} is not a variable name, or its value holds a NUL byte")
        return value

    @model_validator(mode="after")
    def _slurm_fields(self) -> "Host":
        if self.scheduler != "slurm" and (self.partition or self.account or self.qos or self.slurm_env):
            raise ValueError("partition, account, qos and slurm_env are for a Slurm host (--scheduler slurm)")
        if self.scheduler == "slurm" and self.idle_shutdown_minutes is not None:
            raise ValueError("idle_shutdown_minutes: a Slurm cluster is never powered off by orch (its allocations "
                             "end with their jobs)")
        return self

    @property
    def slurm(self) -> bool:
        return self.scheduler == "slurm"

    @property
    def hello_slurm(self) -> dict[str, str] | None:
        """``hello``'s ``slurm`` argument: the env for Slurm's commands on a Slurm host, else None."""
        return dict(self.slurm_env) if self.slurm else None

    @property
    def target(self) -> str:
        if self.kind == "local":
            return "this machine"
        if self.provider is not None and not self.address:
            return f"{self.provider.name}:{self.provider.instance}"
        return f"{self.user}@{self.address}:{self.port}"


def parse_ssh_command(text: str) -> dict[str, object]:
    """Read what providers show (``ssh -p 23456 root@host``, ``-i KEY``, ``-o Port=``,
    ``user@host:port``, ``ssh://user@host:port``) into address/port/user/identity_file."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"cannot read --ssh {text!r}: {exc}") from None
    if words and Path(words[0]).name == "ssh":
        words = words[1:]
    out: dict[str, object] = {}
    dest: str | None = None
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-p", "-i", "-l", "-o"):
            if i + 1 >= len(words):
                raise UsageError(f"--ssh: {word} needs a value")
            value = words[i + 1]
            i += 2
            if word == "-p":
                out["port"] = _port(value)
            elif word == "-i":
                out["identity_file"] = value
            elif word == "-l":
                out["user"] = value
            else:
                key, _, val = value.partition("=")
                key = key.strip().lower()
                if key == "port":
                    out["port"] = _port(val.strip())
                elif key == "user":
                    out["user"] = val.strip()
                elif key == "identityfile":
                    out["identity_file"] = val.strip()
                elif key not in ("stricthostkeychecking", "userknownhostsfile", "serveraliveinterval"):
                    raise UsageError(f"--ssh: option -o {key} is not supported")
            continue
        if word.startswith("-"):
            if len(word) > 1 and all(c in "46ACNTXYqtv" for c in word[1:]):
                i += 1
                continue
            raise UsageError(f"--ssh: option {word} is not supported")
        if dest is not None:
            raise UsageError(f"--ssh: expected one destination, got {dest!r} and {word!r} (a remote command is not allowed)")
        dest = word
        i += 1
    if dest is None:
        raise UsageError(f"--ssh {text!r} names no host (expected e.g. 'ssh -p 23456 root@region-9.example.com')")
    if dest.startswith("ssh://"):
        dest = dest[len("ssh://"):]
    user, at, hostport = dest.rpartition("@")
    if at:
        out.setdefault("user", user)
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            out["port"] = _port(rest[1:])
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
        out["port"] = _port(port)
    else:
        host = hostport
    if not host:
        raise UsageError(f"--ssh {text!r} names no host")
    out["address"] = host
    return out


def _port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise UsageError(f"--ssh: {value!r} is not a port number")
    return int(value)


class Inventory:
    """The hosts a user added; ``get`` also resolves ``local`` and inline hosts."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or orch_home()
        self.dir = self.home / "hosts"

    def local(self) -> Host:
        return Host(name=LOCAL, kind="local", root=str(self.home / "local"))

    def _file(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def names(self) -> list[str]:
        """The inventory's entry names (file names; the entries are not read)."""
        return sorted(p.stem for p in self.dir.glob("*.json")) if self.dir.is_dir() else []

    def get(self, name: str) -> Host:
        """The entry ``name``. An entry that cannot be used — unreadable, not UTF-8, not
        JSON, a field out of range, a pinned host key that is not a valid key, or a ``name``
        other than its file's — raises ``LocalFileError`` (exit 2) naming the file and the fix,
        before anything connects."""
        if name == LOCAL:
            return self.local()
        path = self._file(name)
        if not path.is_file():
            known = ", ".join([LOCAL] + self.names())
            raise UsageError(f"unknown host {name!r} (known: {known}); add it with `orch hosts add {name} --ssh \"ssh -p PORT user@host\"`")
        try:
            host = Host.model_validate_json(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise self.broken(name, f"unreadable: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise self.broken(name, "not UTF-8 text") from None
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error.get("loc", ()))
            if error.get("type") == "extra_forbidden":  # a field a newer orch writes: say so before the fix
                raise self.broken(name, f"{where}: a field this orch does not know, so a newer orch wrote it; "
                                        "upgrade orch (pip install -U orch-gpu) to use the entry as it is, or") from None
            raise self.broken(name, f"{where + ': ' if where else ''}{error['msg']}") from None
        if host.name != name:
            raise self.broken(name, f"its name is {host.name!r}, not {name!r} as its file name says")
        problem = key_line_problem(host.host_key) if host.host_key else None
        if problem:
            raise self.broken(name, problem)
        return host

    def broken(self, name: str, problem: str) -> LocalFileError:
        """The message for an entry that cannot be used: the file, what is wrong, the fix."""
        return LocalFileError(
            f"{self._file(name)} is not a usable host entry ({problem}): remove it with `orch hosts rm {name}`, "
            f"then add the host again with `orch hosts add {name} --ssh \"ssh -p PORT user@host\" ... --trust`")

    def resolve(self, ref: str | InlineHost) -> Host:
        """An inventory name, ``local``, or an inline host from a job file."""
        if isinstance(ref, str):
            return self.get(ref)
        pinned = None
        if self._file(ref.name).is_file():
            pinned = self.get(ref.name).host_key
        return Host(
            name=ref.name, address=ref.address, port=ref.port, user=ref.user,
            identity_file=ref.identity_file, password_env=ref.password_env,
            root=ref.root or DEFAULT_ROOT, python=ref.python, host_key=pinned,
        )

    def list(self) -> list[Host]:
        """Every entry; the first that cannot be used raises (``get``)."""
        return [self.get(name) for name in self.names()]

    def survey(self) -> tuple[list[Host], dict[str, LocalFileError]]:
        """Every usable entry, and for each one that is not, by name, why (``orch hosts ls``)."""
        good: list[Host] = []
        bad: dict[str, LocalFileError] = {}
        for name in self.names():
            try:
                good.append(self.get(name))
            except LocalFileError as exc:
                bad[name] = exc
        return good, bad

    def save(self, host: Host) -> None:
        if host.name == LOCAL:
            raise UsageError("`local` is built in and cannot be changed")
        write_private(self._file(host.name), json.dumps(host.model_dump(), indent=2) + "\n")

    def remove(self, name: str) -> None:
        """Delete the entry's file, a broken one too (that is how one is fixed)."""
        if name == LOCAL:
            raise UsageError("`local` is built in and cannot be removed")
        if not self._file(name).is_file():
            self.get(name)  # raises: unknown host
        self._file(name).unlink()
