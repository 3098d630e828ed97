"""Stand-ins for providers' APIs: local HTTP servers whose instances are real sshd processes.

``python -m tests.support.standin autodl --port 8765`` serves one by hand (docs/providers.md).
"""
