"""Getting onto a host: the right transport for it (held, direct or local), new host keys pinned, a
password login turned into a key login.
"""
