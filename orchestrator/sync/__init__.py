"""Workspace sync: choose files and diff them against the host's record, then send the changes as one
tar stream.
"""
