"""Test-support helpers shared by trainguard's test suites.

- ``slowfs``: a FUSE passthrough filesystem whose operations can be blocked,
  delayed or failed on command, served by its own killable process.
- ``mounts``: real tmpfs and loop-ext4 mounts with guaranteed teardown, and
  ``fill`` to drive them to a known usage or ENOSPC.
- ``http_receiver``: a recording HTTP server on 127.0.0.1 with a scriptable
  failure/hang plan and stop/start on the same port.

The pytest fixtures wrapping them live in ``tests/conftest.py``.
"""

# The skip reason of a test that needs a package of the integration extra (pyproject.toml).
NOT_INSTALLED = "is not installed (the integration extra: scripts/setup-venv test integration)"
