"""The helper session on a host: the request loop, what each request does, sync's receiving end, streams, facts."""
