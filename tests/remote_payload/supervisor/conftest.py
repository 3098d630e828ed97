"""The webhook stand-in and the recording desktop notifier (tests/support/webhooks.py)."""

from tests.support.webhooks import desktop, hook  # noqa: F401 - fixtures
