"""Sweeps: one job file -> one validated job per combination, submitted on shared connections, one status row each."""
