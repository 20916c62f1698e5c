"""What a cleanup run leaves behind for people: the report (summary, findings) and the audit log."""
