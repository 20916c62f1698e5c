"""A stand-in launcher named torchrun with two ranks, real processes: each rank prints a step line on
SIGUSR1 and crashes with a traceback on SIGUSR2; rank 0's stdout is a file, as a launcher's log redirect."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.daemon_proc import wait_until

RANK = textwrap.dedent("""
    import os, signal, sys
    def step(*_):
        print("step", flush=True)
    def crash(*_):
        raise RuntimeError("boom")
    signal.signal(signal.SIGUSR1, step)
    signal.signal(signal.SIGUSR2, crash)
    print("ready", flush=True)
    while True:
        signal.pause()
""")
LAUNCHER = textwrap.dedent("""\
    #!{python}
    import os, subprocess, sys
    out = sys.argv[1]
    procs = []
    for rank in range(2):
        log = open(os.path.join(out, f"rank{{rank}}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, "-c", {rank_code!r}],
                                      env={{**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}},
                                      stdout=log, stderr=subprocess.STDOUT))
    with open(os.path.join(out, "pids"), "w") as fh:
        fh.write(" ".join(str(p.pid) for p in procs))
    for p in procs:
        p.wait()
""")


def has_ended(pid: int) -> bool:
    """The process is gone or a zombie. One read, no exists-then-read: a rank reaped between the two
    makes /proc/PID/stat fail with ESRCH rather than ENOENT."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:  # ENOENT or ESRCH: it was reaped
        return True


@contextlib.contextmanager
def launch(tmp_path: Path):
    """A `torchrun` (a script of that name) with two ranks: (launcher, [rank pids], out dir)."""
    script = tmp_path / "bin" / "torchrun"
    script.parent.mkdir()
    script.write_text(LAUNCHER.format(python=sys.executable, rank_code=RANK))
    script.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    launcher = subprocess.Popen([sys.executable, str(script), str(out)])
    ranks: list[int] = []
    try:
        pids = wait_until(lambda: (out / "pids").exists() and (out / "pids").read_text().split(), 20, what="the ranks")
        ranks = [int(p) for p in pids]
        for i in range(2):
            wait_until(lambda i=i: "ready" in (out / f"rank{i}.log").read_text(), 20, what=f"rank {i}")
        yield launcher, ranks, out
    finally:
        for pid in ranks:  # the test's own children's children, by PID
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.kill()
        launcher.wait()


