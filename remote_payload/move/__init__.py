"""Moving a job to another host, the server's side: the source's listing, the target's verified
staging and adoption, a server-to-server pull.
"""
