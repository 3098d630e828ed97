"""``orch hosts add --provider`` through the CLI: what it accepts, and that the entry holds the
token variable's name and never a token, address or password."""

from __future__ import annotations

import json

import pytest

from tests.support.orch import Orch


@pytest.mark.parametrize(("args", "words"), [
    (["--ssh", "ssh root@h", "--provider", "autodl", "--instance", "i", "--token-env", "T"], "give either --ssh"),
    ([], "give either --ssh"),
    (["--provider", "autodl", "--token-env", "T"], "needs --instance ID and --token-env VAR"),
    (["--provider", "autodl", "--instance", "i", "--token-env", "not a name"], "--token-env wants a variable NAME"),
    (["--provider", "autodl", "--instance", "../x", "--token-env", "T"], "invalid --instance"),
    (["--provider", "autodl", "--instance", "i", "--token-env", "T", "--api-url", "ftp://x"], "invalid --api-url"),
    (["--provider", "autodl", "--instance", "i", "--token-env", "T", "--password-env", "PW"],
     "password comes from the provider"),
    (["--ssh", "ssh root@h", "--instance", "i"], "go with --provider"),
])
def test_hosts_add_refuses_what_a_provider_host_cannot_be_with_exit_2(orch: Orch, args: list[str],
                                                                      words: str) -> None:
    bad = orch("hosts", "add", "p1", *args, check=2)
    assert words in bad.stderr and "Traceback" not in bad.stderr
    assert not (orch.home / "hosts" / "p1.json").exists()


def test_the_entry_holds_the_token_variables_name_never_the_token(orch: Orch) -> None:
    orch("hosts", "add", "p2", "--provider", "autodl", "--instance", "abc-123", "--token-env", "MY_TOKEN",
         env={"MY_TOKEN": "secret-token-value"})
    entry = json.loads((orch.home / "hosts" / "p2.json").read_text())
    assert entry["provider"] == {"name": "autodl", "instance": "abc-123", "token_env": "MY_TOKEN", "api_url": None}
    assert entry["address"] == "" and "secret-token-value" not in json.dumps(entry)
    unset = orch("up", "p2", check=2)
    assert "the autodl token variable $MY_TOKEN is not set" in unset.stderr
    plain = orch("up", "local", check=2)
    assert "local is not a provider host" in plain.stderr


def test_a_provider_host_never_opened_has_no_ssh_config_stanza_and_orch_ssh_names_orch_up(orch: Orch) -> None:
    orch("hosts", "add", "p3", "--provider", "autodl", "--instance", "abc-123", "--token-env", "MY_TOKEN")
    orch("hosts", "add", "plain", "--ssh", "ssh -p 2222 root@203.0.113.7")
    block = orch("ssh-config").stdout
    assert "Host orch-plain" in block and "orch-p3" not in block
    refused = orch("ssh", "p3", check=2)
    assert "p3: no pinned host key yet: `orch up p3 --trust` first" in refused.stderr


def test_an_existing_vast_or_runpod_instance_is_added_with_the_key_it_lets_in(orch: Orch) -> None:
    orch("hosts", "add", "v1", "--provider", "vast", "--instance", "81234567", "--token-env", "VAST_API_KEY",
         "--identity", "~/.ssh/id_ed25519")
    orch("hosts", "add", "r1", "--provider", "runpod", "--instance", "abc123xyz", "--token-env", "RUNPOD_API_KEY",
         "--preset", "runpod")
    vast = json.loads((orch.home / "hosts" / "v1.json").read_text())
    assert vast["provider"]["name"] == "vast" and vast["identity_file"] == "~/.ssh/id_ed25519"
    runpod = json.loads((orch.home / "hosts" / "r1.json").read_text())
    assert runpod["provider"]["name"] == "runpod" and runpod["root"] == "/workspace/orch"
    assert runpod["presets"] == ["runpod"]
    refused = orch("up", "v1", env={"VAST_API_KEY": ""}, check=2)
    assert "the vast token variable $VAST_API_KEY is not set" in refused.stderr
