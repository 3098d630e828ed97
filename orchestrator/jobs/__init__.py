"""A job's life from the laptop: submit on every node, its nodes' status, cancel, resume, logs, its submission record."""
