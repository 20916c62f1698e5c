#!/usr/bin/env python3
"""Keep the message catalogs in step with the code (needs Babel: pip install '.[test]').

  python3 scripts/i18n.py update    extract the marked strings, add new ones to every .po, drop gone ones
  python3 scripts/i18n.py compile   write each .po's .mo next to it (the .mo files are committed)
  python3 scripts/i18n.py check     list msgids without a translation; exit 1 if any

Marked strings: _("...") and N_("...") in daemon/trainguard, plus the English texts other
modules define that are rendered through the catalog (notify.texts_gpu.translated_sources).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "daemon" / "trainguard"
LOCALE = PACKAGE / "locale"
KEYWORDS = {"_": None, "N_": None}


def extract() -> dict[str, list[tuple[str, int]]]:
    """msgid -> [(file, line)] for every marked string in the package."""
    from babel.messages.extract import extract_from_dir

    sys.path.insert(0, str(ROOT / "daemon"))
    found: dict[str, list[tuple[str, int]]] = {}
    method_map = [("**.py", "python")]
    for filename, lineno, message, _comments, _context in extract_from_dir(
            str(PACKAGE), method_map, keywords=KEYWORDS, comment_tags=(), strip_comment_tags=True):
        if isinstance(message, str) and message:
            found.setdefault(message, []).append((f"trainguard/{filename}", lineno))
    from trainguard.notify.texts_gpu import translated_sources

    for message in translated_sources():
        found.setdefault(message, []).append(("trainguard/notify/texts_gpu.py", 0))
    return found


def catalogs() -> list[Path]:
    return sorted(LOCALE.glob("*/LC_MESSAGES/trainguard.po"))


def read(path: Path):
    from babel.messages.pofile import read_po

    with path.open("rb") as fh:
        return read_po(fh, locale=path.parents[1].name)


def update() -> None:
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    template = Catalog(project="trainguard", domain="trainguard")
    for message, locations in extract().items():
        template.add(message, locations=locations)
    for path in catalogs():
        catalog = read(path)
        catalog.update(template, no_fuzzy_matching=True)
        catalog.obsolete.clear()
        with path.open("wb") as fh:
            write_po(fh, catalog, width=110, omit_header=False, include_previous=False)
        print(f"{path.relative_to(ROOT)}: {len(catalog)} messages")


def compiled(path: Path) -> bytes:
    from babel.messages.mofile import write_mo

    buf = io.BytesIO()
    write_mo(buf, read(path), use_fuzzy=False)
    return buf.getvalue()


def compile_all() -> None:
    for path in catalogs():
        path.with_suffix(".mo").write_bytes(compiled(path))
        print(f"{path.with_suffix('.mo').relative_to(ROOT)} written")


def missing(path: Path) -> list[str]:
    catalog = read(path)
    out = []
    for message in extract():
        entry = catalog.get(message)
        if entry is None or not entry.string or entry.fuzzy:
            out.append(message)
    return out


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "check"
    if command == "update":
        update()
    elif command == "compile":
        compile_all()
    elif command == "check":
        bad = {p: missing(p) for p in catalogs()}
        for path, messages in bad.items():
            for message in messages:
                print(f"{path.relative_to(ROOT)}: no translation for {message!r}")
        return 1 if any(bad.values()) else 0
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
