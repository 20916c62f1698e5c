"""Samplers read the system and return plain records. Roots and clocks are parameters."""
