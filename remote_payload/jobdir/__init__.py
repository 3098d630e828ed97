"""A job folder and what guards it, for every server part: status, manifest, records, processes, leases.

Standard library only: all of it runs before a job's setup step has installed anything.
"""
