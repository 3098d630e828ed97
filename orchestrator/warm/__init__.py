"""The warm server: a process that has orch's commands imported and forks one per command.

A tiny client (``orch``'s entry point) hands it the terminal, argv, folder and environment, so
a command costs a fork instead of Python's imports. Layout: ``wire`` (where a server lives,
the messages), ``client`` (the entry point), ``server`` (listen, fork, reap), ``child`` (a
forked process becoming the client's command).
"""
