"""Stage 5, diagnosis: why a GPU stalls (processes, blocked threads, files, mounts), off the cycle thread."""
