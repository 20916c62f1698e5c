"""Cleanup, as a pipeline: plan (select units per policy kind), guard (the safety limits), execute (delete
with a re-check, relative to an open directory), report (summary, audit). runner.CleanupRunner drives it.

Here, the pipeline: runner.py (one policy run: plan -> guard -> execute -> report), worker.py (the
daemon's cleanup thread), plan.py (the interface a kind implements, and the run's context), guard.py
(the checks around a run), selection.py (what each policy selects: pure). Its rooms, in the order
the data flows through them:

- kinds/: one module per policy type (age and the caches, checkpoints, the huggingface hub, logs),
  each planning and executing its deletions with the engine;
- engine/: the one traversal (walker.py) and the per-entry judges (agerules.py, in C _agescan.c),
  the age passes built on them, the one max_delete bound every kind asks (bound.py), and deletion
  without deleting anything else (quarantine.py; aside.py for checkpoints and units; unittree.py);
- safety/: which roots may be worked in (roots.py) and what is in use (inuse.py: open, mapped or held
  by the kernel; uninspected.py: processes whose files cannot be seen);
- record/: what a run tells people (report.py) and the audit log of every deletion (audit.py).
"""
