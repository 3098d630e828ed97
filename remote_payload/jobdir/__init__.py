"""A job folder and what guards it, as every server part reads and writes it: status,
manifest, records, processes, leases (standard library only).
"""
