"""A host entry's provider opened with its token, read from the named environment variable.

The token is read here and nowhere else; it is never stored, printed or put in argv.
"""

from __future__ import annotations

import os

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host, ProviderRef
from orchestrator.providers.api import Provider

NAMES = ("autodl",)


def open_provider(ref: ProviderRef) -> Provider:
    """The provider behind ``ref``; exit 2 when its token variable is unset or empty."""
    token = os.environ.get(ref.token_env, "")
    if not token:
        raise UsageError(f"the {ref.name} token variable ${ref.token_env} is not set: export {ref.token_env}=... "
                         f"(the developer token from the provider's console)")
    if ref.name == "autodl":
        from orchestrator.providers.autodl import AutoDL

        return AutoDL(token, ref.api_url)
    raise UsageError(f"unknown provider {ref.name!r} (known: {', '.join(NAMES)})")


def provider_of(host: Host) -> Provider:
    """``open_provider`` for a provider host; a plain host is a usage error."""
    if host.provider is None:
        raise UsageError(f"{host.name} is not a provider host (add it with --provider)")
    return open_provider(host.provider)
