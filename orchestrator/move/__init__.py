"""orch resume JOB --on HOST: a job continued on other hosts, through the laptop or copied server to server."""
