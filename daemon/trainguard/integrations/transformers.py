"""A transformers.TrainerCallback that checks the disk before every checkpoint save.

    from trainguard.integrations.transformers import DiskGuardCallback
    trainer = Trainer(..., callbacks=[DiskGuardCallback(reserve="5GiB")])

DefaultFlowCallback decides in on_step_end / on_epoch_end whether the Trainer saves at this
step; this callback runs after it, before the save. When the checkpoint would not fit it turns
the save off and stops the run (the previous checkpoint stays the last good one); when it
fits but the next one would not (after save_total_limit's rotation), it lets this save
happen and stops the run right after it: save, then stop, instead of a crash mid-write.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from trainguard.guard.heartbeat import progress
from trainguard.guard.space import Reserve, list_checkpoints, tree_bytes
from trainguard.integrations.common import (
    GO,
    STOP,
    Verdict,
    decide,
    estimate,
    report_stop,
)

CHECKPOINTS = ("checkpoint-*",)  # transformers' PREFIX_CHECKPOINT_DIR


def rotation_frees(output_dir: str, save_total_limit: int | None, best: str | None) -> int:
    """Bytes the Trainer's rotation deletes after one more save (oldest first, never the best)."""
    if not save_total_limit or save_total_limit <= 0:
        return 0
    found = list_checkpoints(output_dir, CHECKPOINTS)
    extra = len(found) + 1 - save_total_limit
    older = [(p, st) for p, st in found if best is None or p.rstrip("/") != str(best).rstrip("/")]
    return sum(tree_bytes(p, st) for p, st in older[:max(0, extra)])


class DiskGuardCallback(TrainerCallback):
    def __init__(self, reserve: Reserve = None, *, state_dir: str | None = None):
        self.reserve = reserve
        self.state_dir = state_dir
        self.stopped: Verdict | None = None  # why the run was stopped, once it was

    def on_step_end(self, args, state, control, **kwargs: Any):
        progress(state.global_step, state_dir=self.state_dir)  # the progress watchdog's heartbeat
        return self._before_save(args, state, control, kwargs)

    def on_epoch_end(self, args, state, control, **kwargs: Any):
        return self._before_save(args, state, control, kwargs)

    def _before_save(self, args, state, control, kwargs: dict[str, Any]):
        if not control.should_save:
            return control
        output_dir = str(args.output_dir)
        nbytes = estimate(output_dir, CHECKPOINTS, kwargs.get("model"), kwargs.get("optimizer"))
        freed = rotation_frees(output_dir, args.save_total_limit, state.best_model_checkpoint)
        verdict = decide(output_dir, nbytes, self.reserve, freed)
        if verdict.action == GO:
            return control
        if verdict.action == STOP:
            control.should_save = False
        control.should_training_stop = True
        if self.stopped is None:
            self.stopped = verdict
            if state.is_world_process_zero:
                report_stop(verdict, output_dir, "transformers", self.state_dir)
        return control
