"""A job's files brought home, verified: the untrusted manifest, what earlier fetches verified, --watch, the move kit."""
