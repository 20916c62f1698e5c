"""The cleanup kinds, one per policy type (runner.KINDS): each plans what would go on a root and executes
it with the engine (plan.Kind). logs is the exception: it rotates files in place (logs.rotate_logs)."""
