"""The host's GPU queue: each job's supervisor waits here for its GPUs; no daemon (standard library only)."""
