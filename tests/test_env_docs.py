"""docs/environment.md documents every TRAINGUARD_* variable a user can set, and its examples work."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel
from trainguard import config

DOC = Path(__file__).resolve().parents[1] / "docs" / "environment.md"


def _is_model(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def variables(model: type[BaseModel] = config.Config, prefix: str = "TRAINGUARD_") -> list[str]:
    """One variable per scalar key of a section; a list (of tables or values) is one JSON variable."""
    names = []
    for name, field in model.model_fields.items():
        var = prefix + (field.alias or name).upper()
        annotation = field.annotation
        if _is_model(annotation):
            names += variables(annotation, var + "__")
        else:
            names.append(var)
    return names


def test_every_variable_is_documented():
    text = DOC.read_text()
    missing = [v for v in variables() if not re.search(rf"`{v}`", text)]
    assert not missing, f"variables missing from docs/environment.md: {missing}"


def test_the_documented_examples_load(tmp_path):
    """Every `export TRAINGUARD_...='...'` line in the page is a valid override on its own."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    examples = re.findall(r"^export (TRAINGUARD_[A-Z_0-9]+)='(.*)'$", DOC.read_text(), re.MULTILINE)
    assert len(examples) >= 5
    for name, value in examples:
        loaded = config.load(str(empty), {name: value})
        assert loaded.env_vars == (name,)
