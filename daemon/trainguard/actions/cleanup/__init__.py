"""Cleanup, as a pipeline: plan (select units per policy kind), guard (the safety limits), execute (delete
with a re-check, relative to an open directory), report (summary, audit). runner.CleanupRunner drives it."""
