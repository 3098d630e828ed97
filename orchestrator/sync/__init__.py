"""Workspace sync: files chosen and diffed against the host's record, the changes sent as one tar stream."""
