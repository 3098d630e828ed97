"""The Python API the CLI stands on: submit, status, logs, wait, fetch, cancel, resume, hosts, spend, instances, tunnel.

docs/python-api.md. Module-level functions use one ``Orch`` of this process's ``ORCH_HOME``; make an ``Orch`` for
another home or to see orch's progress lines (``Orch(say=print)``). Results are frozen records
with the fields ``--json`` prints; failures raise ``OrchError`` subclasses. Importing this
package loads neither click nor rich.
"""

from __future__ import annotations

from typing import Any

from orchestrator.api.client import Orch
from orchestrator.api.results import FetchResult, HostInfo, Job, JobStatus
from orchestrator.errors import HostError, OrchError, RemoteError, SpecError, SweepIncomplete, UsageError

_default: Orch | None = None


def default() -> Orch:
    """The ``Orch`` the module-level functions use (made on first use)."""
    global _default
    if _default is None:
        _default = Orch()
    return _default


def submit(job: Any, **options: Any) -> Job | list[Job]:
    """``Orch.submit`` on the default ``Orch``."""
    return default().submit(job, **options)


def status(job: Any = None) -> JobStatus | list[JobStatus]:
    """``Orch.status`` on the default ``Orch``."""
    return default().status(job)


def logs(job: Any, follow: bool = False, **options: Any) -> Any:
    """``Orch.logs`` on the default ``Orch``."""
    return default().logs(job, follow, **options)


def wait(job: Any, timeout: float | None = None) -> JobStatus:
    """``Orch.wait`` on the default ``Orch``."""
    return default().wait(job, timeout)


def fetch(job: Any, dest: Any = None, checkpoints: bool = False, **options: Any) -> FetchResult:
    """``Orch.fetch`` on the default ``Orch``."""
    return default().fetch(job, dest, checkpoints, **options)


def cancel(job: Any, **options: Any) -> JobStatus:
    """``Orch.cancel`` on the default ``Orch``."""
    return default().cancel(job, **options)


def resume(job: Any, on: Any = None, **options: Any) -> Job:
    """``Orch.resume`` on the default ``Orch``."""
    return default().resume(job, on, **options)


def spend(month: str | None = None) -> Any:
    """``Orch.spend`` on the default ``Orch``."""
    return default().spend(month)


def hosts() -> list[HostInfo]:
    """``Orch.hosts`` on the default ``Orch``."""
    return default().hosts()


def instances(provider: str | None = None, token_env: str | None = None, api_url: str | None = None) -> Any:
    """``Orch.instances`` on the default ``Orch``."""
    return default().instances(provider, token_env, api_url)


def tunnel(target: Any, ports: Any = (), local: Any = (), bind: str = "127.0.0.1") -> Any:
    """``Orch.tunnel`` on the default ``Orch``."""
    return default().tunnel(target, ports, local, bind)


__all__ = ["Orch", "Job", "JobStatus", "FetchResult", "HostInfo", "OrchError", "UsageError", "SpecError", "HostError",
           "RemoteError", "SweepIncomplete", "submit", "status", "logs", "wait", "fetch", "cancel", "resume", "hosts",
           "spend", "instances", "tunnel", "default"]
