"""The cleanup engine: one traversal below a root (walker), the age rules each entry is judged by
(agerules, compiled in _agescan.c), the passes of the age kind built on them (agepass, with ahead,
remembered, oldest, cacheunits) and the removal of a judged entry or unit without touching anything
else (quarantine, unittree)."""
