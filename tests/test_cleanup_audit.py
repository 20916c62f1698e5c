"""The audit log's storage: the files one batch deleted from one directory are one row of
cleanup_log, and the view cleanup_audit still shows every deleted path on a row of its own; a
database written by an earlier version (cleanup_audit a table, a row per file) is converted
without losing a row or a total."""

from __future__ import annotations

import sqlite3

from trainguard.actions.cleanup.audit import AuditLog, read_freed

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


def test_pruning_drops_old_batches_whole(tmp_path):
    conn = _connect(tmp_path)
    clock = [NOW - 100 * 86400]
    audit = AuditLog(conn, clock=lambda: clock[0])
    audit.record_files("scratch", "/data", "/data/old", [("a", 1, 0.0), ("b", 1, 0.0)], "age")
    clock[0] = NOW
    audit.record_files("scratch", "/data", "/data/new", [("c", 1, 0.0)], "age")
    audit.flush()
    audit.prune()
    assert [p for (_t, _p, _m, p, *_rest) in _audit_view(conn)] == ["/data/new/c"]
    assert conn.execute("SELECT files FROM cleanup_totals").fetchone() == (3,)
