"""Bringing a job's files home, verified: the untrusted manifest, what earlier fetches verified,
``fetch --watch`` and the move kit it keeps.
"""
