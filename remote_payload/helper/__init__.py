"""The helper session on a host: the request loop, what each request does with the root, sync's
receiving end, log and file streams, host facts.
"""
