"""What a pinned host key line must be: ``<type> <base64>`` of a key type paramiko can pin.

Pure; no cryptography is run. The inventory checks every entry's pinned key with it, and a
move checks the fresh key a target host made.
"""

from __future__ import annotations

import base64
import binascii

# The host key types paramiko can pin, and how many length-prefixed fields follow the type
# name in each one's public blob (RFC 4253 6.6, RFC 5656 3.1, RFC 8709 4).
HOST_KEY_FIELDS = {"ssh-ed25519": 1, "ssh-rsa": 2, "ssh-dss": 4, "ecdsa-sha2-nistp256": 2,
                   "ecdsa-sha2-nistp384": 2, "ecdsa-sha2-nistp521": 2}


def key_line_problem(line: str) -> str | None:
    """What is wrong with a pinned host key line (``<type> <base64>``), or None when it is
    well formed: a known type, strict base64, and a blob that is exactly the type name and
    that type's fields (an ed25519 key is 32 bytes). Pure; no cryptography is run."""
    words = line.split()
    if len(words) != 2:
        return "the pinned host key is not '<type> <base64>'"
    kind, text = words
    if kind not in HOST_KEY_FIELDS:
        return f"the pinned host key has an unknown type {kind[:40]!r}"
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return "the pinned host key is not valid base64"
    fields: list[bytes] = []
    at = 0
    while at < len(blob):
        size = int.from_bytes(blob[at:at + 4], "big")
        if at + 4 + size > len(blob):
            return f"the pinned host key is not a valid {kind} key (its data is cut short)"
        fields.append(blob[at + 4:at + 4 + size])
        at += 4 + size
    if not fields or fields[0] != kind.encode():
        return f"the pinned host key is not a valid {kind} key (its data names another type)"
    if len(fields) != 1 + HOST_KEY_FIELDS[kind] or not all(fields[1:]) \
            or (kind == "ssh-ed25519" and len(fields[1]) != 32):
        return f"the pinned host key is not a valid {kind} key"
    return None
