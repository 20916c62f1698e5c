"""Stage 10, the service: wires every stage into the run loop; speaks sd_notify."""
