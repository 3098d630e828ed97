"""A host entry's provider opened with its token, read from the named environment variable
(or, when that is unset and the ``keyring`` package is importable, from the OS keyring:
service ``orch``, user the variable's name).

The token is read here and nowhere else; it is never stored, printed or put in argv.
"""

from __future__ import annotations

import os

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host, ProviderRef
from orchestrator.providers.api import Provider
from orchestrator.providers.registry import NAMES, PROVIDERS

KEYRING_SERVICE = "orch"


def token_from(token_env: str) -> str | None:
    """``$token_env``, else the keyring's ``orch``/``token_env`` entry where ``keyring`` is
    installed (never required); None when neither holds one."""
    token = os.environ.get(token_env, "")
    if token:
        return token
    try:
        import keyring  # optional: pip install keyring
    except ImportError:
        return None
    try:
        return keyring.get_password(KEYRING_SERVICE, token_env) or None
    except Exception:  # a keyring without a usable backend is the same as no keyring
        return None


def open_named(name: str, token_env: str, api_url: str | None) -> Provider:
    """Provider ``name`` (an entry of ``providers/registry.py``, its adapter built with the token
    of ``token_env``); exit 2 when the name is unknown or there is no token."""
    if name not in NAMES:
        raise UsageError(f"unknown provider {name!r} (known: {', '.join(NAMES)})")
    token = token_from(token_env)
    if not token:
        raise UsageError(f"the {name} token variable ${token_env} is not set: export {token_env}=... "
                         f"(the API token from the provider's console; or `keyring set {KEYRING_SERVICE} {token_env}`"
                         " with the keyring package)")
    return PROVIDERS[name].load()(token, api_url)


def open_provider(ref: ProviderRef) -> Provider:
    """The provider behind ``ref``; exit 2 when its token is missing."""
    return open_named(ref.name, ref.token_env, ref.api_url)


def provider_of(host: Host) -> Provider:
    """``open_provider`` for a provider host; a plain host is a usage error."""
    if host.provider is None:
        raise UsageError(f"{host.name} is not a provider host (add it with --provider)")
    return open_provider(host.provider)
