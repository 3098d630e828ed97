"""A job's files brought home, verified: the untrusted manifest, what earlier fetches verified, --watch, the move kit."""

DEFAULT_INTERVAL_S = 30.0  # seconds between --watch rounds (here: the commands' options read it without the watch)
