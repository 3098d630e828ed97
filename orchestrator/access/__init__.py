"""Getting onto a host: the right transport (held, direct or local), host keys pinned, a password login made a key."""
