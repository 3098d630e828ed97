"""``on_finish.notify``: one HTTP POST when a job ends, from the server (standard library only).

The supervisor of node 0 calls ``notify`` once per attempt, just before it writes the end
(so the outcome's line is in the log a follower reads); the end waits at most ``timeout_s``
and is never changed by the call. The body is the JSON a chat
webhook expects: Slack (``{"text"}``), Feishu/Lark (``{"msg_type": "text", "content"}``),
DingTalk (``{"msgtype": "text", "text"}``), chosen by ``format`` or, with ``auto``, by the
URL's host (anything else gets Slack's shape plus the job's fields). The URL is a secret
(Slack and DingTalk put their tokens in it): what is logged names only its scheme and host.
``url_env`` names a variable of the server's environment (its login shell), so the URL never
has to be written in the job file. Failures are one log line; ``timeout_s`` bounds the call.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.parse
from typing import Any, Callable, Dict, Mapping, Optional

from remote_payload.jobdir.status import last_metrics

HOSTS = {"hooks.slack.com": "slack", "open.feishu.cn": "feishu", "open.larksuite.com": "feishu",
         "oapi.dingtalk.com": "dingtalk"}
MAX_TEXT = 2000


def shown(url: str) -> str:
    """The URL as logs may show it: scheme and host only (paths and queries hold tokens)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
    except ValueError:
        return "(an unreadable URL)"
    return "%s://%s/…" % (parts.scheme or "?", host)


def text_of(job: Dict[str, Any], status: Dict[str, Any]) -> str:
    """One line for a person: the job, its end, where, why, and its last numbers."""
    metrics = status.get("metrics") if isinstance(status.get("metrics"), dict) else {}
    numbers = ", ".join("%s %s" % (k, ("%.4g" % v) if isinstance(v, float) else v)
                        for k, v in metrics.items() if k in ("step", "loss", "eval_loss") and v is not None)
    line = "orch: %s %s on %s" % (job.get("job_id"), status.get("state"), socket.gethostname())
    if status.get("reason"):
        line += ": %s" % status["reason"]
    if numbers:
        line += " (%s)" % numbers
    return line[:MAX_TEXT]


def body_of(fmt: str, url: str, text: str, job: Dict[str, Any], status: Dict[str, Any]) -> Dict[str, Any]:
    if fmt == "auto":
        fmt = HOSTS.get((urllib.parse.urlsplit(url).hostname or "").lower(), "json")
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if fmt == "dingtalk":
        return {"msgtype": "text", "text": {"content": text}}
    body: Dict[str, Any] = {"text": text}
    if fmt == "json":
        body.update(job_id=job.get("job_id"), state=status.get("state"), reason=status.get("reason"),
                    exit_code=status.get("exit_code"), host=socket.gethostname(), ended=status.get("ended"),
                    metrics=status.get("metrics") if isinstance(status.get("metrics"), dict) else None)
    return body


def notify(job: Dict[str, Any], status: Dict[str, Any], say: Callable[[str], None], job_dir: Optional[str] = None,
           env: Optional[Mapping[str, str]] = None) -> bool:
    """POST the job's end to its ``on_finish.notify`` webhook when its state is one it asks
    for (the last metrics row of ``job_dir`` in the message); True when the endpoint accepted
    it. Never raises."""
    cfg = (job.get("on_finish") or {}).get("notify")
    if not isinstance(cfg, dict) or status.get("state") not in (cfg.get("on") or ()):
        return False
    metrics = last_metrics(os.path.join(job_dir, "metrics.jsonl")) if job_dir else None
    status = dict(status, metrics=metrics) if metrics else status
    env = os.environ if env is None else env
    url = cfg.get("url") or env.get(str(cfg.get("url_env") or ""), "")
    if not url:
        say("on_finish.notify: $%s is not set on this host: nobody was notified" % cfg.get("url_env"))
        return False
    where = shown(url)
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        say("on_finish.notify: %s is not an http(s) URL: nobody was notified" % where)
        return False
    from urllib.error import HTTPError, URLError  # here: ~60 ms of every supervisor's start otherwise
    from urllib.request import Request, urlopen

    data = json.dumps(body_of(str(cfg.get("format") or "auto"), url, text_of(job, status), job, status)).encode()
    request = Request(url, data=data, method="POST",
                      headers={"Content-Type": "application/json; charset=utf-8", "User-Agent": "orch"})
    started = time.time()
    try:
        with urlopen(request, timeout=float(cfg.get("timeout_s") or 10)) as response:
            code, answer = response.status, response.read(4096)
    except HTTPError as exc:
        say("on_finish.notify: %s answered HTTP %d: nobody was notified" % (where, exc.code))
        return False
    except (URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        say("on_finish.notify: %s failed after %.1f s: %s" % (where, time.time() - started,
                                                              str(reason).replace(url, where)[:200]))
        return False
    refused = _refused(answer)
    if refused:
        say("on_finish.notify: %s refused the message: %s" % (where, refused))
        return False
    say("on_finish.notify: told %s (HTTP %d)" % (where, code))
    return True


def _refused(answer: bytes) -> Optional[str]:
    """Feishu and DingTalk answer HTTP 200 with an error code in the body; their words, cut short."""
    try:
        value = json.loads(answer.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    code = value.get("errcode", value.get("code", value.get("StatusCode", 0)))
    if code in (0, None, "0"):
        return None
    return ("%s %s" % (code, value.get("errmsg") or value.get("msg") or value.get("StatusMessage") or ""))[:200]
