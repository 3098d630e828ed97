"""Talking to a host's helper session: the shipped payload, one session per command, the typed requests."""
