"""``orch resume JOB --on HOST``: a job continued on other hosts, through the laptop or server to
server.
"""
