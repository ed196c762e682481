"""The audit store: what every run, call, decision and approval was, kept in SQLite."""
