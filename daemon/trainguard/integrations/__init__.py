"""Training-framework callbacks built on trainguard.guard: each imports its framework only when used.

- trainguard.integrations.transformers.DiskGuardCallback: a transformers.TrainerCallback
- trainguard.integrations.lightning.DiskGuard: a lightning.pytorch Callback
Install with the extras: pip install "trainguard[transformers]" or "trainguard[lightning]".
"""
