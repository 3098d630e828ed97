"""The managed-jobs controller: a process on a host that stays on, watching managed jobs (docs/managed.md)."""
