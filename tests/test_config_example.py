"""config.example.toml is the reference for users: it must be valid and list every option."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel
from trainguard import config

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


def _model_of(annotation):
    """The BaseModel inside an annotation like `Foo`, `list[Foo]`, `Foo | None` or a union of models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found.extend(_model_of(arg))
    return found


def _option_names(model: type[BaseModel]) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        names.add(field.alias or name)
        for sub in _model_of(field.annotation):
            names |= _option_names(sub)
    return names


def test_example_passes_check_config():
    result = subprocess.run([sys.executable, "-m", "trainguard", "check-config", str(EXAMPLE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_example_mentions_every_option():
    text = EXAMPLE.read_text()
    keys = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.MULTILINE))
    tables = set(re.findall(r"^#?\s*\[\[?([a-z_.]+)\]\]?", text, re.MULTILINE))
    written = keys | {part for t in tables for part in t.split(".")}
    missing = sorted(_option_names(config.Config) - written)
    assert not missing, f"options missing from config.example.toml: {missing}"
