"""Names the dead-code finder cannot see used: `vulture daemon/trainguard .ci/vulture_whitelist.py`.

Each entry says who uses it. Pydantic validators and the @renders text renderers are ignored by decorator ([tool.vulture] in
pyproject.toml). Anything else vulture reports is dead: remove it rather than list it here.
"""

# ruff: noqa
# mypy: ignore-errors
_ = object()

# Called by frameworks and libraries, never by name in this package.
_.collect  # surfaces/exporter.py: prometheus_client calls a collector's collect() on each scrape
_.log_message  # surfaces/pages.py: http.server's logging hook, overridden to stay quiet
protocol_version  # surfaces/pages.py: http.server reads these to speak HTTP/1.1 and answer malformed requests
default_request_version
_.rfile  # surfaces/pages.py: http.server's parser reads the request head from it
http2  # config/web.py: exporter-toolkit's key, accepted so the same file loads; the port speaks HTTP/1.1
_.on_any_event  # sources/logwatch.py: watchdog's event handler
_.msg  # redact.py: the logging.LogRecord field a filter rewrites
_.socket_connect_timeout  # notify/apprise_sender.py: set on apprise's plugin objects
_.socket_read_timeout
model_config  # config/base.py: pydantic's model settings
_.slurm_account  # sources/owner.py: Owner fields read through asdict() (to_dict), never by name
_.slurm_user
_.user
FINDING_KINDS  # actions/guard_inbox.py: the finding kinds its keys are built from, read by tests/test_i18n.py

# The in-training-loop API (guard/, integrations/): used by training scripts, not by the daemon.
DiskGuard  # integrations/lightning.py: a Lightning callback and its hooks
_.on_train_batch_end
_.on_train_epoch_end
batch_idx  # hook signatures fixed by Lightning
outputs
storage_options
_.should_stop
AtomicCheckpointIO
DiskGuardCallback  # integrations/transformers.py: a Trainer callback and its hooks
_.on_step_end
_.on_epoch_end
_.should_training_stop
_.short_by  # guard/space.py: Fit.short_by, the bytes a checkpoint lacks, for training scripts

# notify/texts*.py: renderers register by @renders(kind) (ignored by decorator in pyproject.toml).
translated_sources  # notify/texts_gpu.py: scripts/i18n.py collects the catalog's sources with it

# Fields of records that callers and the tests read; the package itself only fills them.
dirs_removed  # actions/cleanup/record/report.py: CleanupReport, asserted by the cleanup tests
newest_mtime  # records.py: CheckpointFact, read by tests/test_next_checkpoint.py
newest_path
rchar  # sources/procs.py: IoCounters, read by name through diagnosis/threads.IO_FIELDS
wchar
read_bytes
write_bytes

# Operations API used by tests, benchmarks and docs.
last_copy  # actions/mirror/record.py: what the record says was last copied of one file
_.rounds  # actions/mirror/worker.py: finished rounds per mirror (bench/, docs/mirror.md)
_.wait_rounds

# actions/cleanup/kinds/logfile.py: the fallocate flag named beside the one used; Rotated.lines_window_s is set by
# a truncating rotation (the window logrotate also has) and read by no code yet.
FALLOC_FL_KEEP_SIZE
lines_window_s

# actions/cleanup/engine/agerules.py: _agescan.c's result codes, all named so the numbers match the C enum; the Python
# side compares only some of them.
IGNORED
IS_DIR
GRACE
YOUNG
EXPIRED
# actions/cleanup/runner.py: kinds are imported by "module:Class" name when a policy of that type first runs.
CheckpointsKind
HfKind
