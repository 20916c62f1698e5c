"""Stage 2, sources: samplers read the system (statvfs, diskstats, NVML, /proc) and training logs, and return plain records. Roots and clocks are parameters."""
