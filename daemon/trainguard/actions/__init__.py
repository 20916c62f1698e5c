"""Actions trainguard takes on its own: cleanup policies (cleanup/), mirror copies (mirror/), and what
trainers' save-time guard did, turned into alerts and audit rows (guard_inbox)."""
