"""The host inventory: entries and the built-in local host, pinned host keys, provider presets, ~/.ssh/config."""
