"""A job's life from the laptop: submit on every node, its nodes' status, cancel and resume, its logs,
the record of its submission.
"""
