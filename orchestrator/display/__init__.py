"""Jobs shown to people: progress columns, tables fitted to the terminal, training curves, a word when a job ends."""
