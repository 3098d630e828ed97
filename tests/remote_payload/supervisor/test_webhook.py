"""on_finish.notify (issue 15): the server POSTs the job's end to a webhook — Slack, Feishu and
DingTalk bodies, a URL from the server's environment, failures as one line that never shows
the URL's path or query, the job's state untouched. A real local HTTP server; real jobs on
`local` and the loopback sshd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_payload.supervisor import webhook
from tests.support.orch import Orch, write_job
from tests.support.webhooks import Hook

SECRET = "T0KEN-s3cret"


def job(orch: Orch, host: str, notify: dict, command: list[str] | None = None) -> Path:
    spec = write_job(orch.cwd, "hooked", host, command or ["python", "-c", "print('hi')"])
    spec.write_text(spec.read_text() + "on_finish:\n  notify: " + json.dumps(notify) + "\n")
    return spec


def job_log(orch: Orch, job_id: str) -> str:
    return orch("logs", job_id).stdout


def test_a_finished_job_posts_dingtalks_body_and_logs_no_secret(orch: Orch, host: str, hook: Hook) -> None:
    url = hook.url(f"/robot/send?access_token={SECRET}")
    done = json.loads(orch("submit", str(job(orch, host, {"url": url, "format": "dingtalk"})), "--follow", "--json",
                           timeout=300).stdout)
    assert done["state"] == "succeeded"
    (request,) = hook.requests
    assert request["path"] == f"/robot/send?access_token={SECRET}"
    assert request["body"]["msgtype"] == "text"
    assert request["body"]["text"]["content"].startswith(f"orch: {done['job_id']} succeeded on ")
    log = job_log(orch, done["job_id"])
    assert "on_finish.notify: told http://127.0.0.1/… (HTTP 200)" in log
    assert SECRET not in log and "/robot/send" not in log


def test_the_url_can_stay_on_the_server_and_a_missing_one_is_said(orch: Orch, hook: Hook) -> None:
    spec = job(orch, "local", {"url_env": "TEAM_HOOK", "format": "slack"})
    done = json.loads(orch("submit", str(spec), "--follow", "--json", env={"TEAM_HOOK": hook.url(f"/s/{SECRET}")}).stdout)
    assert hook.requests[0]["body"] == {"text": hook.requests[0]["body"]["text"]}  # Slack's shape: text only
    assert SECRET not in orch("show", done["job_id"]).stdout  # never in the recorded spec
    again = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert "on_finish.notify: $TEAM_HOOK is not set on this host: nobody was notified" in job_log(orch, again["job_id"])
    assert len(hook.requests) == 1


@pytest.mark.parametrize(("status", "answer", "said"), [
    (500, b"oops", "answered HTTP 500"),
    (200, b'{"errcode": 310000, "errmsg": "keywords not in content"}', "refused the message: 310000 keywords not in content"),
    (200, b'{"code": 19001, "msg": "param invalid: incoming webhook access token invalid"}', "refused the message: 19001"),
])
def test_a_refusing_endpoint_is_one_line_and_the_job_still_succeeds(orch: Orch, hook: Hook, status: int,
                                                                       answer: bytes, said: str) -> None:
    hook.status, hook.answer = status, answer
    done = json.loads(orch("submit", str(job(orch, "local", {"url": hook.url(f"/x/{SECRET}")})), "--follow", "--json").stdout)
    assert done["state"] == "succeeded"
    log = job_log(orch, done["job_id"])
    assert said in log and SECRET not in log


def test_an_unreachable_or_slow_endpoint_is_bounded_and_named(orch: Orch, hook: Hook) -> None:
    hook.delay = 5.0
    slow = json.loads(orch("submit", str(job(orch, "local", {"url": hook.url(), "timeout_s": 1})), "--follow",
                           "--json").stdout)
    assert slow["state"] == "succeeded" and "failed after" in job_log(orch, slow["job_id"])
    dead = json.loads(orch("submit", str(job(orch, "local", {"url": "http://127.0.0.1:9/nope"})), "--follow",
                           "--json").stdout)
    assert dead["state"] == "succeeded"
    assert "on_finish.notify: http://127.0.0.1/… failed after" in job_log(orch, dead["job_id"])


def test_only_the_states_asked_for_notify(orch: Orch, hook: Hook) -> None:
    fails = job(orch, "local", {"url": hook.url(), "on": ["failed"]}, ["python", "-c", "raise SystemExit(3)"])
    done = json.loads(orch("submit", str(fails), "--follow", "--json", check=1).stdout)
    assert done["state"] == "failed" and len(hook.requests) == 1
    assert "failed" in hook.requests[0]["body"]["text"]
    json.loads(orch("submit", str(job(orch, "local", {"url": hook.url(), "on": ["failed"]})), "--follow", "--json").stdout)
    assert len(hook.requests) == 1


@pytest.mark.parametrize(("notify", "words"), [
    ({"url": "http://a", "url_env": "B"}, "exactly one of url and url_env"),
    ({}, "exactly one of url and url_env"),
    ({"url": "ftp://files.example.com/x"}, "http:// or https://"),
    ({"url_env": "not a name"}, "url_env"),
    ({"url": "http://a", "format": "teams"}, "format"),
])
def test_a_bad_notify_block_is_exit_2_at_its_field(orch: Orch, notify: dict, words: str) -> None:
    out = orch("check", str(job(orch, "local", notify)), check=2)
    assert "on_finish.notify" in out.stderr and words in out.stderr and "Traceback" not in out.stderr


def test_bodies_by_format_and_by_the_urls_host() -> None:
    job_, status = {"job_id": "j-1"}, {"state": "failed", "reason": "rank 0: OOM", "exit_code": 1}
    text = webhook.text_of(job_, status)
    assert text.startswith("orch: j-1 failed on ") and text.endswith(": rank 0: OOM")
    assert webhook.body_of("auto", "https://hooks.slack.com/services/T/B/X", text, job_, status) == {"text": text}
    assert webhook.body_of("auto", "https://open.feishu.cn/open-apis/bot/v2/hook/x", text, job_, status) == \
        {"msg_type": "text", "content": {"text": text}}
    assert webhook.body_of("auto", "https://oapi.dingtalk.com/robot/send?access_token=x", text, job_, status) == \
        {"msgtype": "text", "text": {"content": text}}
    generic = webhook.body_of("auto", "https://example.com/hook", text, job_, status)
    assert generic["state"] == "failed" and generic["job_id"] == "j-1" and generic["text"] == text
    assert webhook.shown("https://hooks.slack.com/services/T/B/X?token=1") == "https://hooks.slack.com/…"
