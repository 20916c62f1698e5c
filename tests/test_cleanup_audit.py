"""The audit log's storage: the files one batch deleted from one directory are one row of
cleanup_log, and the view cleanup_audit still shows every deleted path on a row of its own; a
database written by an earlier version (cleanup_audit a table, a row per file) is converted
without losing a row or a total."""

from __future__ import annotations

import os
import sqlite3
import textwrap
import time
from pathlib import Path

from tests.support.cli import trainguard
from trainguard.actions.cleanup.record.audit import AuditLog, read_freed

NOW = 1_800_000_000.0
OLD_SCHEMA = """
CREATE TABLE cleanup_audit (ts REAL NOT NULL, policy TEXT NOT NULL, mount TEXT NOT NULL, path TEXT NOT NULL,
                            bytes INTEGER NOT NULL, files INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE INDEX cleanup_audit_ts ON cleanup_audit (ts);
CREATE INDEX cleanup_audit_policy_ts ON cleanup_audit (policy, ts);
CREATE TABLE cleanup_totals (policy TEXT PRIMARY KEY, files INTEGER NOT NULL, bytes INTEGER NOT NULL, last_run REAL);
"""
OLD_ROWS = [(NOW - 3 * 86400, "scratch", "/data", "/data/tmp/a.bin", 100, 1, "age: older than 7d"),
            (NOW - 600, "scratch", "/data", "/data/tmp/b.bin", 200, 1, "age: older than 7d"),
            (NOW - 300, "ckpt", "/data", "/data/run/checkpoint-1", 4096, 3, "keep_last 2")]


def _connect(tmp_path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / "state.db", isolation_level=None)


def _audit_view(conn) -> list[tuple]:
    return sorted(conn.execute("SELECT * FROM cleanup_audit"))


def test_one_row_per_batch_and_one_path_per_file_in_the_view(tmp_path):
    conn = _connect(tmp_path)
    audit = AuditLog(conn, clock=lambda: NOW)
    audit.record_files("scratch", "/data", "/data/tmp", [("a.bin", 100, 9e5), ("b\udcff\x1b.bin", 200, 9e5)],
                       "age: older than 7d")
    audit.record("ckpt", "/data", "/data/run/checkpoint-1", 4096, 3, "keep_last 2")
    audit.flush()
    assert conn.execute("SELECT path, bytes, files FROM cleanup_log ORDER BY rowid").fetchall() == [
        ("/data/tmp", 300, 2), ("/data/run/checkpoint-1", 4096, 3)]
    assert _audit_view(conn) == sorted([
        (NOW, "scratch", "/data", "/data/tmp/a.bin", 100, 1, "age: older than 7d"),
        (NOW, "scratch", "/data", "/data/tmp/b\\xff\\x1b.bin", 200, 1, "age: older than 7d"),
        (NOW, "ckpt", "/data", "/data/run/checkpoint-1", 4096, 3, "keep_last 2")])
    assert [e[2] for e in audit.entries("scratch")] == ["/data/tmp/b\\xff\\x1b.bin", "/data/tmp/a.bin"]  # newest first
    (ckpt, scratch) = read_freed(conn, NOW)
    assert (scratch.files_24h, scratch.bytes_24h, ckpt.files_24h, ckpt.bytes_24h) == (2, 300, 3, 4096)


def test_a_database_with_a_row_per_file_is_converted_and_loses_nothing(tmp_path):
    conn = _connect(tmp_path)
    conn.executescript(OLD_SCHEMA)
    conn.executemany("INSERT INTO cleanup_audit VALUES (?, ?, ?, ?, ?, ?, ?)", OLD_ROWS)
    conn.execute("INSERT INTO cleanup_totals VALUES ('scratch', 2, 300, ?), ('ckpt', 3, 4096, ?)", (NOW, NOW))
    before = read_freed(conn, NOW)  # `trainguard status` before the daemon first opens it
    assert [(f.policy, f.files_24h) for f in before] == [("ckpt", 3), ("scratch", 1)]

    audit = AuditLog(conn, clock=lambda: NOW)
    assert conn.execute("SELECT type FROM sqlite_master WHERE name = 'cleanup_audit'").fetchone() == ("view",)
    assert _audit_view(conn) == sorted(OLD_ROWS)
    assert read_freed(conn, NOW) == before
    audit.record_files("scratch", "/data", "/data/tmp", [("c.bin", 50, 9e5)], "age: older than 7d")
    audit.flush()
    AuditLog(conn, clock=lambda: NOW)  # opened again: nothing to convert
    assert _audit_view(conn) == sorted(OLD_ROWS + [(NOW, "scratch", "/data", "/data/tmp/c.bin", 50, 1,
                                                    "age: older than 7d")])
    scratch = [f for f in read_freed(conn, NOW) if f.policy == "scratch"][0]
    assert (scratch.files_24h, scratch.files_total, scratch.bytes_total) == (2, 3, 350)


def test_each_write_drops_batches_past_the_retention_and_keeps_the_totals(tmp_path):
    conn = _connect(tmp_path)
    clock = [NOW - 100 * 86400]
    audit = AuditLog(conn, clock=lambda: clock[0], retention=90 * 86400)
    audit.record_files("scratch", "/data", "/data/old", [("a", 1, 0.0), ("b", 1, 0.0)], "age")
    audit.flush()
    clock[0] = NOW - 10 * 86400  # 90 days after the first batch, not more: it stays
    audit.record_files("scratch", "/data", "/data/mid", [("c", 1, 0.0)], "age")
    audit.flush()
    assert len(_audit_view(conn)) == 3
    clock[0] = NOW
    audit.record_files("scratch", "/data", "/data/new", [("d", 1, 0.0)], "age")
    audit.flush()
    assert [p for (_t, _p, _m, p, *_rest) in _audit_view(conn)] == ["/data/mid/c", "/data/new/d"]
    assert conn.execute("SELECT files FROM cleanup_totals").fetchone() == (4,)


def test_a_cleanup_run_from_cron_keeps_the_audit_to_its_configured_retention(tmp_path):
    """`trainguard cleanup` on its own (no daemon): the log does not grow for good."""
    state = tmp_path / "state"
    state.mkdir()
    old = AuditLog(_connect(state), clock=lambda: time.time() - 40 * 86400)
    old.record_files("scratch", "/data", str(tmp_path / "scratch"), [("last-month.bin", 10, 0.0)], "age")
    old.flush()
    old.conn.close()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for n in range(3):
        path = scratch / f"old{n}.bin"
        path.write_bytes(b"x" * 100)
        os.utime(path, (time.time() - 30 * 86400,) * 2)
    cfg = tmp_path / "config.toml"
    cfg.write_text(textwrap.dedent(f"""
        [general]
        state_dir = "{state}"
        [history]
        audit_retention = "30d"
        [[cleanup]]
        name = "scratch"
        type = "age"
        roots = ["{scratch}"]
        older_than = "7d"
        age_by = ["mtime"]
        grace = "0s"
    """))
    done = trainguard("cleanup", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    conn = _connect(state)
    assert sorted(Path(p).name for (_t, _p, _m, p, *_rest) in _audit_view(conn)) == ["old0.bin", "old1.bin",
                                                                                    "old2.bin"]
    assert conn.execute("SELECT files FROM cleanup_totals").fetchone() == (4,)  # last month's one counted still
