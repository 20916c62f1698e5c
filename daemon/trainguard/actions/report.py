"""What a cleanup run tells people: the report records, one-line and per-policy summaries, findings."""

from __future__ import annotations


def printable(path: str) -> str:
    """A path as text any terminal, log or database takes: bytes that are not UTF-8 (kept by
    os.fsdecode as surrogates) are shown escaped, as \\xff; control characters too."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        path = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if not path.isprintable():
        path = "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)
    return path
