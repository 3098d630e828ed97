"""Gitignore-style patterns (workspace.exclude, .gitignore, .orchignore, outputs:) matched in time linear in a path's length."""
