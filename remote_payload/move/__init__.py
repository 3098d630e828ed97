"""A job moved to another host, the server's side: the source's listing, verified staging, adoption, a direct pull."""
