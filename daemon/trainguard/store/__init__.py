"""Stage 3, the store: history of samples (SQLite), the state database and the daemon heartbeat."""
