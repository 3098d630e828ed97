"""The host inventory: entries, the built-in ``local`` host, provider presets, the ``~/.ssh/config``
block.
"""
