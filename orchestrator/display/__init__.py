"""Showing jobs to people: progress columns, tables fitted to the terminal, training-curve plots, a
word when a job ends.
"""
