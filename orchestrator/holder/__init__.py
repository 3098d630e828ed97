"""The kept-warm connection per host (like OpenSSH's ControlPersist): the daemon, its commands, the
wire, spawning, the client transport.
"""
