"""The one compiled part: the age policy's per-entry cleanup loop (see actions/cleanup/engine/agepass.py).

Optional: without a C compiler the package installs and cleanup runs the same rules in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("trainguard.actions.cleanup.engine._agescan",
                             ["daemon/trainguard/actions/cleanup/engine/_agescan.c"],
                             optional=True, extra_compile_args=["-O2"])])
