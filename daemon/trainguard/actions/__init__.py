"""Actions trainguard takes on its own: cleanup policies (walker, safety, policies, runner, audit, worker)."""
