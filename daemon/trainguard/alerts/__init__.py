"""Stage 6, decisions: the alert lifecycle (pending, firing, resolved) after Alertmanager."""
