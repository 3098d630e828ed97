"""The orch command line: one module per command, errors mapped in main; the only importer of click."""
