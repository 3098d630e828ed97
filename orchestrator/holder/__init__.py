"""The kept-warm connection per host (like ControlPersist): daemon, commands, wire, spawning, the client transport."""
