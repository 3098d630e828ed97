"""orch's server side, shipped to each host content-addressed; entry points train.py and report.py."""
