"""The controller's managed jobs: taken over from a laptop, checked on a period, recovered.

Each managed job is a file ``<home>/managed/<job_id>.json`` (``Managed``), rewritten atomically
before every step that acts, so a controller killed at any point and started again goes on
from what it wrote: a recovery it had begun (``phase: recovering``, its ``target`` named) is
finished, never started twice (the move continues where it stopped and the target's ``adopt``
is idempotent: a job already adopted there is not started again).

A check of a job (``Jobs.check``), for each job not ``done``:

1. a round of the job's ``fetch --watch`` (``fetch/watch.py``): the latest complete
   checkpoint and the job's files kept on the controller's disk (``<home>/runs/<job_id>/``,
   the kit a move reads when the job's hosts are gone); the round that sees the job ended is
   the final fetch of its outputs;
2. the job ended: ``succeeded``, ``failed`` (the script's own error: never restarted) or
   ``cancelled`` — done, said in the log and to the webhook, what was rented released;
3. the job is lost — its host unreachable for ``ORCH_LOST_AFTER_S``, its supervisor gone
   without a terminal state, or its provider saying the box is stopped, exited or released —
   it is recovered: the old attempt fenced and the job moved (``Orch.resume(on=...)``, the
   ``orch resume --on`` machinery) to the first host of ``recovery.hosts`` that answers, from
   the job's hosts when they answer, else from the kept copy — or, when none takes it and the
   job's own host answers, restarted there (``orch resume``); at most ``max_restarts`` times.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from orchestrator.api import Orch
from orchestrator.controller.service import Service, log, read_json
from orchestrator.errors import HostError, OrchError, RemoteError, UsageError
from orchestrator.home import write_private
from orchestrator.hosts.inventory import Host
from remote_payload.contract.protocol import LOST, TERMINAL

FAILED, SUCCEEDED = "failed", "succeeded"
CHAT_HOSTS = {"hooks.slack.com": "slack", "open.feishu.cn": "feishu", "open.larksuite.com": "feishu",
              "oapi.dingtalk.com": "dingtalk"}
IN_PLACE = "(where it ran)"  # a recovery's target: the job restarted on its own host


class Jobs:
    """The managed jobs of one controller (its ORCH_HOME ``home``)."""

    def __init__(self, service: Service, home: Path) -> None:
        self.service, self.home = service, home
        self.folder = home / "managed"
        self.lock = threading.Lock()  # one check at a time; hand-overs wait for it
        self.watches: dict[str, Any] = {}
        self.orch = Orch(home, say=lambda line: log(f"  {line}"))

    # -- files ------------------------------------------------------------------------------

    def path(self, job_id: str) -> Path:
        return self.folder / f"{job_id}.json"

    def load(self, job_id: str) -> dict[str, Any]:
        return read_json(self.path(job_id), {})

    def save(self, managed: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(self.path(managed["job_id"]), json.dumps(managed, indent=1, sort_keys=True) + "\n")

    def all(self) -> list[dict[str, Any]]:
        found = [read_json(p, None) for p in sorted(self.folder.glob("*.json"))] if self.folder.is_dir() else []
        return [m for m in found if isinstance(m, dict) and isinstance(m.get("job_id"), str)]

    # -- hand-over ----------------------------------------------------------------------------

    def manage(self, request: dict[str, Any]) -> dict[str, Any]:
        """Take a job over (``handover.hand_over``): its hosts, keys, registry row, secrets.
        Never waits for a check under way (a recovery takes minutes)."""
        record, recovery = request["record"], request["recovery"]
        job_id = str(record["job_id"])
        keys = self.home / "keys"
        keys.mkdir(parents=True, exist_ok=True, mode=0o700)
        for entry in request.get("hosts") or []:
            host = Host.model_validate(entry)
            key = (request.get("keys") or {}).get(host.name)
            if key:
                write_private(keys / host.name, key)
                host = host.model_copy(update={"identity_file": str(keys / host.name)})
            self.orch.inventory.save(host)
        registry = self.orch.registry
        registry.add(job_id, str(record["name"]), str(record["spec_path"]), list(record["hosts"]),
                     str(record["job_dir"]), str(record["state"]), dict(record.get("detail") or {}),
                     secret_env=list(record.get("secret_env") or []))
        self.service.take_secrets(dict(request.get("secrets") or {}))
        self.service.want([str(n) for n in request.get("names") or []])
        if not self.path(job_id).is_file():
            self.save({"job_id": job_id, "recovery": recovery, "notify": request.get("notify"),
                       "phase": "watching", "restarts": 0, "hosts": list(record["hosts"]), "history": [],
                       "rented": [], "taken_at": time.time(), "checked_at": None, "state": record["state"],
                       "note": ""})
        log(f"{job_id}: managed (on {', '.join(record['hosts'])}; may continue on "
            f"{', '.join(recovery.get('hosts') or []) or 'no other host'}; at most {recovery.get('max_restarts')} "
            "restart(s))")
        return {"managed": job_id, **self.service.status()}

    def describe(self) -> dict[str, Any]:
        found = []
        for m in self.all():
            try:
                job_dir: str | None = self.orch.registry.get(m["job_id"]).job_dir
            except OrchError:
                job_dir = None
            found.append({k: m.get(k) for k in ("job_id", "phase", "state", "hosts", "restarts", "checked_at",
                                                 "note", "history")} | {"recoveries": m.get("restarts", 0),
                                                                        "job_dir": job_dir})
        return {"jobs": found}

    def cancel(self, request: dict[str, Any]) -> dict[str, Any]:
        """``orch cancel``: the job is no longer managed (after the check under way, if any)."""
        job_id = str(request.get("job_id"))
        if not self.lock.acquire(timeout=45):
            return {"error": f"a check of the managed jobs (a recovery) is under way: run orch cancel {job_id} again"}
        try:
            m = self.load(job_id)
            if not m:
                return {"error": f"{job_id} is not managed here"}
            if m.get("phase") != "done":
                m.update(phase="done", state="cancelled", note="cancelled with orch cancel: no longer managed")
                self.save(m)
                log(f"{job_id}: {m['note']}")
            return {"cancelled": job_id}
        finally:
            self.lock.release()

    # -- checks -------------------------------------------------------------------------------

    def check_all(self) -> None:
        with self.lock:
            for managed in self.all():
                if managed.get("phase") != "done":
                    try:
                        self.check(managed)
                    except OrchError as exc:
                        log(f"{managed['job_id']}: check failed: {str(exc).splitlines()[0]}")

    def check(self, m: dict[str, Any]) -> None:
        job_id = m["job_id"]
        if m.get("phase") == "recovering":  # a recovery begun before this controller was (re)started
            self.recover_to(m)
            return
        status = self.watch_round(m)
        m["checked_at"] = time.time()
        if status is not None and status.get("state") in TERMINAL:
            self.finish(m, status)
            return
        if status is not None and status.get("state") == LOST:
            why = f"its supervisor on {', '.join(m['hosts'])} is gone without a terminal state"
        else:
            now = self.orch.status(job_id)
            m["state"] = now.state  # type: ignore[union-attr]
            if now.state != LOST:  # type: ignore[union-attr]
                self.save(m)
                return
            answered = self.watches.get(job_id) is not None and self.watches[job_id].outage is None
            why = (self.box_down if self.box_down is not None
                   else f"its supervisor on {', '.join(m['hosts'])} is gone without a terminal state" if answered
                   else f"{', '.join(m['hosts'])} unreachable for ORCH_LOST_AFTER_S")
        self.begin_recovery(m, why)

    box_down: str | None = None

    def watch_round(self, m: dict[str, Any]) -> dict[str, Any] | None:
        """One round of the job's watch; its status when the job settled (the final fetch done)."""
        from orchestrator.fetch.watch import Watch
        from orchestrator.jobs.nodes import StoppedWithBox

        job_id = m["job_id"]
        watch = self.watches.get(job_id)
        if watch is None:
            watch = Watch(self.orch.registry.get(job_id), self.orch.inventory, self.orch.registry, self.home / "runs",
                          lambda line: log(f"{job_id}: {line}"), extra=["checkpoints/"])
            self.watches[job_id] = watch
        self.box_down = None
        try:
            return watch.attempt()
        except StoppedWithBox as exc:  # the provider says the box is off, released or failed
            self.box_down = str(exc).splitlines()[0]
            return {"state": LOST}

    def finish(self, m: dict[str, Any], status: dict[str, Any]) -> None:
        state, job_id = str(status.get("state")), m["job_id"]
        m.update(phase="done", state=state, ended_at=time.time())
        if state == FAILED:
            m["note"] = f"the script failed (exit {status.get('exit_code')}): not restarted"
        elif state == SUCCEEDED:
            m["note"] = f"outputs kept in {self.home / 'runs' / job_id}"
        self.save(m)
        log(f"{job_id}: {state}" + (f"; {m['note']}" if m.get("note") else ""))
        self.release_rented(m)
        self.notify(m, f"orch: {job_id} {state} on {', '.join(m['hosts'])}"
                    + (f" after {m['restarts']} recovery(ies)" if m.get("restarts") else ""))

    def begin_recovery(self, m: dict[str, Any], why: str) -> None:
        job_id, limit = m["job_id"], int(m["recovery"].get("max_restarts", 0))
        if m.get("restarts", 0) >= limit:
            m.update(phase="done", state=LOST, note=f"lost ({why}); max_restarts ({limit}) reached: not recovered")
            self.save(m)
            log(f"{job_id}: {m['note']}")
            self.notify(m, f"orch: {job_id} lost on {', '.join(m['hosts'])}: {m['note']}")
            self.release_rented(m)
            return
        m.update(phase="recovering", restarts=m.get("restarts", 0) + 1, why=why, target=None,
                 tried=[], began_at=time.time())
        self.save(m)  # durable before anything acts: a restarted controller finishes this recovery
        log(f"{job_id}: lost ({why}): recovery {m['restarts']} of {limit}")
        self.recover_to(m)

    def recover_to(self, m: dict[str, Any]) -> None:
        """Move the job to the first recovery host that takes it (the one named ``target``
        first: a recovery that was under way)."""
        job_id = m["job_id"]
        record = self.orch.registry.get(job_id)
        if m.get("target") == IN_PLACE and self.orch.status(job_id).state != LOST:  # type: ignore[union-attr]
            self.recovered(m, record.hosts[0])  # restarted where it was before this controller was restarted
            return
        if m.get("target") and record.hosts == [m["target"]]:  # moved before a restart: it is done
            self.recovered(m, m["target"])
            return
        begun = [m["target"]] if m.get("target") and m["target"] != IN_PLACE else []
        candidates = [h for h in begun + list(m["recovery"].get("hosts") or [])
                      if h not in record.hosts]
        for name in dict.fromkeys(candidates):
            if self.move_to(m, name):
                return
        if len(record.hosts) == 1:  # last: where it ran, when that host answers (its supervisor was gone)
            m["target"] = IN_PLACE
            self.save(m)
            try:
                self.orch.resume(job_id)
            except (HostError, RemoteError, UsageError) as exc:
                log(f"{job_id}: {record.hosts[0]} did not restart it: {str(exc).splitlines()[0]}")
            else:
                self.recovered(m, record.hosts[0])
                return
        rent = m["recovery"].get("rent")
        if rent:
            name = self.rented_host(m, rent)
            if name is not None and self.move_to(m, name):
                return
        m["target"] = None
        m["note"] = f"no recovery host took it (tried {', '.join(m.get('tried') or []) or 'none'}); trying again"
        self.save(m)
        log(f"{job_id}: {m['note']}")

    def move_to(self, m: dict[str, Any], name: str) -> bool:
        """Move the job to ``name`` (written down first as the recovery's target); False, said,
        when that host does not take it."""
        m["target"] = name
        self.save(m)
        try:
            self.orch.resume(m["job_id"], on=[name], why=f"recovery {m['restarts']}: {m.get('why')}")
        except (HostError, RemoteError, UsageError) as exc:
            log(f"{m['job_id']}: {name} did not take it: {str(exc).splitlines()[0]}")
            m["tried"] = list(dict.fromkeys([*m.get("tried", []), name]))
            return False
        self.recovered(m, name)
        return True

    def rented_host(self, m: dict[str, Any], rent: dict[str, Any]) -> str | None:
        """A host rented for this recovery (``recovery.rent``, ``access/rent.py``), or None (said).
        The name is written down before the rental and an entry of that name is used again, so a
        controller restarted mid-rental never rents twice."""
        from orchestrator.access.rent import RentRequest, rent as rent_one

        job_id = m["job_id"]
        name = f"rent-{job_id.rsplit('-', 1)[-1]}-{m['restarts']}"
        if name in self.orch.inventory.names():
            return name
        m["rented"] = list(dict.fromkeys([*m.get("rented", []), name]))
        self.save(m)
        request = RentRequest(name=name, provider=rent["provider"], gpu=rent["gpu"], max_price=rent.get("max_price"),
                              interruptible=bool(rent.get("interruptible")), token_env=rent.get("token_env"),
                              api_url=rent.get("api_url"), user=rent.get("user") or "root", root=rent.get("root"),
                              python=rent.get("python") or "python3")
        try:
            rent_one(self.orch.inventory, request, lambda line: log(f"{job_id}: {line}"))
        except OrchError as exc:
            log(f"{job_id}: renting a replacement failed: {str(exc).splitlines()[0]}")
            return name if name in self.orch.inventory.names() else None
        return name

    def release_rented(self, m: dict[str, Any]) -> None:
        """Give back every instance rented for the job (its disks too): billing stops."""
        from orchestrator.providers.open import open_named

        for name in m.get("rented", []):
            if name not in self.orch.inventory.names():
                continue
            host = self.orch.inventory.get(name)
            if host.provider is None:
                continue
            try:
                provider = open_named(host.provider.name, host.provider.token_env, host.provider.api_url)
                provider.release(host.provider.instance)
            except OrchError as exc:
                log(f"{m['job_id']}: releasing {name} failed ({str(exc).splitlines()[0]}): orch release {name} "
                    "on the controller's host")
                continue
            self.orch.inventory.remove(name)
            log(f"{m['job_id']}: released {name} ({host.provider.name} instance {host.provider.instance})")

    def recovered(self, m: dict[str, Any], name: str) -> None:
        job_id = m["job_id"]
        line = {"at": time.time(), "from": m["hosts"], "to": [name], "why": m.get("why"), "restart": m["restarts"]}
        m.update(phase="watching", hosts=[name], target=None, note="", state="pending",
                 history=[*m.get("history", []), line])
        self.watches.pop(job_id, None)
        self.save(m)
        log(f"{job_id}: recovered on {name} (recovery {m['restarts']}: {m.get('why')})")
        self.notify(m, f"orch: {job_id} recovered: moved from {', '.join(line['from'])} to {name} ({m.get('why')})")

    # -- webhook -------------------------------------------------------------------------------

    def notify(self, m: dict[str, Any], text: str) -> None:
        """The job's ``on_finish.notify`` webhook, told ``text`` (one POST; a failure is one log line)."""
        notify = m.get("notify")
        if not isinstance(notify, dict):
            return
        import os

        url = notify.get("url") or os.environ.get(str(notify.get("url_env") or ""))
        if not url:
            log(f"{m['job_id']}: webhook not called: {notify.get('url_env')} is not in the controller's memory")
            return
        fmt = notify.get("format") or "auto"
        body: dict[str, Any] = {"text": text, "job_id": m["job_id"], "event": "managed", "state": m.get("state"),
                                "hosts": m.get("hosts"), "restarts": m.get("restarts")}
        if fmt == "auto":  # as the server's webhook picks it (remote_payload/supervisor/webhook.py)
            fmt = CHAT_HOSTS.get((urllib.parse.urlsplit(url).hostname or "").lower(), "json")
        if fmt == "feishu":
            body = {"msg_type": "text", "content": {"text": text}}
        elif fmt == "dingtalk":
            body = {"msgtype": "text", "text": {"content": text}}
        elif fmt == "slack":
            body = {"text": text}
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=float(notify.get("timeout_s") or 10)) as answer:
                answer.read(4096)
        except (OSError, ValueError) as exc:
            log(f"{m['job_id']}: webhook failed: {type(exc).__name__}")


def attach(service: Service) -> None:
    """Give ``service`` its duty (check every managed job) and the ``manage`` request."""
    jobs = Jobs(service, service.layout.home)
    service.duty = jobs.check_all
    service.describe = jobs.describe
    service.ops["manage"] = jobs.manage
    service.ops["cancel"] = jobs.cancel
