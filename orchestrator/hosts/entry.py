"""An inventory entry made from what ``orch hosts add`` is given: where the host is
(``address``: ``--ssh``'s command, or a provider's instance) and the entry itself
(``new_entry``: orch's defaults filled in, a field the model refuses worded as ``UsageError``,
exit 2, naming the field). Pure; saves nothing, connects nowhere.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import ValidationError

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import DEFAULT_ROOT, Host, ProviderRef, parse_ssh_command
from orchestrator.providers.registry import PRESETS
from orchestrator.spec.model import ENV_KEY_RE


def address(ssh_command: str | None, provider: str | None, instance: str | None, token_env: str | None,
            api_url: str | None, password_env: str | None, install_key: bool) -> dict[str, object]:
    """The entry's address fields: from ``--ssh`` (``parse_ssh_command``), or a provider
    reference (docs/providers.md). ``UsageError`` naming the options when both or neither are
    given, or when a provider's options are missing, misplaced or invalid."""
    if (ssh_command is None) == (provider is None):
        raise UsageError("give either --ssh \"ssh -p PORT user@host\" or --provider NAME --instance ID --token-env VAR")
    if provider is None:
        if instance or token_env or api_url:
            raise UsageError("--instance, --token-env and --api-url go with --provider")
        return parse_ssh_command(ssh_command or "")
    if not instance or not token_env:
        raise UsageError(f"--provider {provider} needs --instance ID and --token-env VAR (the variable's name)")
    if password_env or install_key:
        raise UsageError("a provider host's password comes from the provider: drop --password-env / --install-key")
    if not ENV_KEY_RE.match(token_env):
        raise UsageError(f"--token-env wants a variable NAME (like AUTODL_TOKEN), got {token_env!r}")
    try:
        return {"provider": ProviderRef(name=provider, instance=instance, token_env=token_env,  # type: ignore[arg-type]
                                        api_url=api_url)}
    except ValidationError as exc:
        error = exc.errors()[0]
        raise UsageError(f"invalid --{str(error['loc'][0]).replace('_', '-')}: {error['msg']}") from None


def new_entry(name: str, *, root: str | None, python: str | None, presets: Sequence[str],
              **fields: Any) -> Host:
    """The entry ``name`` with ``fields`` (``address``'s among them): its root is ``root``,
    else the first of ``presets`` that has one, else ``DEFAULT_ROOT``; its python ``python``,
    else ``python3``. ``UsageError`` (``invalid host: FIELD: why``) when the model refuses a
    field."""
    preset_root = next((PRESETS[p].root for p in presets if PRESETS[p].root), None)
    try:
        return Host(name=name, root=root or preset_root or DEFAULT_ROOT, python=python or "python3",
                    presets=list(presets), **fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ()))
        message = str(error["msg"]).removeprefix("Value error, ")
        raise UsageError(f"invalid host: {where + ': ' if where else ''}{message}") from None
