"""What the laptop keeps: the SQLite job registry, each host's reachability, the run folders orch writes."""
