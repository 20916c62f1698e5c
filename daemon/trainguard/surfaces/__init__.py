"""Stage 9, surfaces: what people and Prometheus read (metrics endpoint, status)."""
