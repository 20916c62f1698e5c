"""only_if_mirrored: is there an identical copy of a local checkpoint on the mirror's share?

The share may hang, so it is never touched from the daemon's own threads: one child
process per check stats the copies and answers line by line; past the deadline it is
killed and every unanswered candidate counts as "not mirrored" (it stays). Identical
means what rsync's quick check means: every file of the unit exists on the share with
the same size and the same mtime in whole seconds.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Mapping, Sequence

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import walker
from trainguard.actions.cleanup.record.report import printable
from trainguard.actions.cleanup.safety.roots import Root
from trainguard.config import Mirror, mirrored_path

# The child: reads one JSON document {key: [[path, size, mtime_s], ...]} on stdin and prints
# one line per key: "<key>\tok", "<key>\tmissing\t<n>\t<error>" or "<key>\tdiffers\t<n>" (n: which
# file). Only the standard library, no site packages; no path is printed (it may not be UTF-8).
_CHILD = r"""
import json, os, sys
todo = json.load(sys.stdin)
for key, files in todo.items():
    why = "ok"
    for n, (path, size, mtime) in enumerate(files):
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError as exc:
            why = "missing\t%d\t%s" % (n, exc.strerror or "error")
            break
        if st.st_size != size or int(st.st_mtime) != mtime:
            why = "differs\t%d" % n
            break
    print(key + "\t" + why, flush=True)
"""


def unit_files(parent_fd: int, name: str, dev: int, mnt: int | None) -> list[tuple[str, int, int]]:
    """(path below the unit, size, mtime_s) of every file in a unit directory, mount points not entered
    (dev and mnt: the root's, which parent_fd is on)."""
    fd = walker.open_dir_at(parent_fd, name, dev, mnt)
    try:
        def refuse(p: walker.WalkProblem) -> None:
            raise OSError(0, f"{p.path}: {p.reason}")

        return [(e.path, e.st.st_size, int(e.st.st_mtime))
                for e in walker.walk(fd, dev=dev, on_problem=refuse, mnt=mnt) if not e.is_dir]
    finally:
        os.close(fd)


def check_copies(wanted: Mapping[str, Sequence[tuple[str, int, int]]], timeout: float) -> dict[str, str]:
    """key -> "ok" or why not, for each key of wanted ({key: [(dest path, size, mtime_s)]}).

    Keys the child did not answer within timeout map to "the mirror did not answer within
    Ns" (a hung share): the caller keeps those checkpoints.
    """
    if not wanted:
        return {}
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
    answers: dict[str, str] = {}
    try:
        proc.stdin.write(json.dumps({k: list(v) for k, v in wanted.items()}).encode())
        proc.stdin.close()
        _read_answers(proc, answers, time.monotonic() + timeout)
    except OSError:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()  # stuck on the share: a killable wait (FUSE, NFS) ends with the signal
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        proc.stdout.close()
    silent = f"the mirror did not answer within {timeout:g}s"
    return {key: answers.get(key, silent) for key in wanted}


def _read_answers(proc: subprocess.Popen, answers: dict[str, str], deadline: float) -> None:
    fd = proc.stdout.fileno()
    buf = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _w, _x = select.select([fd], [], [], left)
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            key, _, why = line.decode("utf-8", "replace").partition("\t")
            answers[key] = why


def _explain(answer: str, files: Sequence[tuple[str, int, int]]) -> str:
    kind, _, rest = answer.partition("\t")
    if kind not in ("missing", "differs"):
        return answer
    index, _, error = rest.partition("\t")
    path = printable(files[int(index)][0]) if index.isdigit() and int(index) < len(files) else "?"
    return f"no copy at {path} ({error})" if kind == "missing" else f"the copy {path} differs in size or mtime"


def only_mirrored(cands: list[sel.Candidate], root: Root, mirror: Mirror, run, timeout: float) -> list[sel.Candidate]:
    """The candidates with an identical copy at mirror.dest; the others are skipped as "not-mirrored"."""
    wanted: dict[str, list[tuple[str, int, int]]] = {}
    for n, cand in enumerate(cands):
        local = os.path.join(root.path, cand.relpath)
        dest = mirrored_path(mirror, local)
        if dest is None:
            run.skip("not-mirrored", local, f"not below mirror {mirror.name!r} source {mirror.source}")
            continue
        try:
            files = _local_files(root, cand)
        except OSError as exc:
            run.skip("not-mirrored", local, f"cannot list it: {exc.strerror}")
            continue
        wanted[str(n)] = [(os.path.join(dest, rel) if rel else dest, size, mtime) for rel, size, mtime in files]
    answers = check_copies(wanted, timeout)
    out = []
    for key, answer in answers.items():
        cand = cands[int(key)]
        if answer == "ok":
            out.append(cand)
        else:
            run.skip("not-mirrored", os.path.join(root.path, cand.relpath), _explain(answer, wanted[key]))
    return out


def _local_files(root: Root, cand: sel.Candidate) -> list[tuple[str, int, int]]:
    parent, _, name = cand.relpath.rpartition("/")
    pfd = walker.open_beneath(root.fd, parent, root.dev, root.mnt)
    try:
        if cand.is_unit:
            return unit_files(pfd, name, root.dev, root.mnt)
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        return [("", st.st_size, int(st.st_mtime))]
    finally:
        os.close(pfd)
