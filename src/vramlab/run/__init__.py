"""The run: one runner, one session, for every kind of run (run/kind.py's ``RunKind``)."""
