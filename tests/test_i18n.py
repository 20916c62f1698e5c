"""Every text a person reads has its Chinese translation, and the shipped catalog matches its source."""

from __future__ import annotations

import ast
import gettext
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trainguard.i18n import LOCALE_DIR, format_when, tr
from trainguard.notify.texts import RENDERERS

from tests.support.http_receiver import HttpReceiver

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "daemon" / "trainguard"
PO = LOCALE_DIR / "zh" / "LC_MESSAGES" / "trainguard.po"


def _tool():
    pytest.importorskip("babel")
    spec = importlib.util.spec_from_file_location("i18n_tool", REPO / "scripts" / "i18n.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prefix(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return None


def _returned_prefixes(tree: ast.AST) -> dict[str, list[str]]:
    """function name -> the f-string prefixes it returns (key builders such as log_match_key)."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            out[node.name] = [p for r in ast.walk(node) if isinstance(r, ast.Return) and (p := _prefix(r.value))]
    return out


def _declared_kinds(tree: ast.AST) -> list[str]:
    """A module whose keys are built from data (f"guard.{event.kind}:...") lists its kinds in FINDING_KINDS."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FINDING_KINDS" for t in node.targets):
            return [e.value for e in node.value.elts]
    return []


def _key_texts(key, assigned: list[str], builders: dict[str, list[str]]) -> list[str | None]:
    if isinstance(key, ast.Name) and key.id == "key":
        return list(assigned)
    if isinstance(key, ast.Call) and getattr(key.func, "id", None) in builders:
        return builders[key.func.id]
    return [_prefix(key)]


def finding_kinds_in_code() -> dict[str, str]:
    """kind -> file, for every Finding(key=...) the package creates: a literal key, a `key = f"..."` assigned
    before the call, or a call of a function of the module that returns one; a key whose kind is built from
    data ("guard.{kind}:") counts the module's FINDING_KINDS and fails without them."""
    kinds: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        builders = _returned_prefixes(tree)
        assigned: list[str] = []
        calls = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "key" for t in node.targets):
                assigned.append(_prefix(node.value) or "")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                calls.append(next((k.value for k in node.keywords if k.arg == "key"), node.args[0] if node.args else None))
        rel = str(path.relative_to(PACKAGE))
        for key in calls:
            for text in _key_texts(key, assigned, builders):
                if text and ":" in text or text == "trainguard.test":
                    kinds[text.split(":", 1)[0]] = rel
                elif text and text.endswith("."):
                    declared = [k for k in _declared_kinds(tree) if k.startswith(text)]
                    assert declared, f"{rel}: a {text}* key built from data needs FINDING_KINDS"
                    kinds.update(dict.fromkeys(declared, rel))
    return kinds


def test_every_finding_kind_the_code_creates_has_a_translated_renderer():
    kinds = finding_kinds_in_code()
    assert {"fs.usage", "fs.forecast", "gpu.stall", "trainguard.test", "log.match", "guard.stopped",
            "cleanup.report"} <= set(kinds)  # the walk finds them
    missing = {k: f for k, f in kinds.items() if k not in RENDERERS}
    assert not missing, f"finding kinds with no renderer in notify/texts*.py (see docs/i18n.md): {missing}"


def test_every_marked_message_has_a_chinese_translation():
    tool = _tool()
    missing = tool.missing(PO)
    assert not missing, f"no zh translation (run scripts/i18n.py update, translate, compile): {missing}"


def test_the_shipped_mo_is_compiled_from_the_po():
    tool = _tool()
    catalog = {m.id: m.string for m in tool.read(PO) if m.id and m.string and not m.fuzzy}
    with open(PO.with_suffix(".mo"), "rb") as fh:
        shipped = gettext.GNUTranslations(fh)
    stale = {k: v for k, v in catalog.items() if shipped.gettext(k) != v}
    assert not stale, f"trainguard.mo is older than trainguard.po: run scripts/i18n.py compile ({list(stale)[:5]})"
    assert len(shipped._catalog) - 1 == len(catalog)  # no entry the .po no longer has (minus the header)


def test_placeholders_survive_translation():
    tool = _tool()
    for m in tool.read(PO):
        if m.id and m.string:
            assert set(re.findall(r"{\w+}", m.id)) == set(re.findall(r"{\w+}", m.string)), m.id


def test_english_needs_no_catalog_and_times_carry_their_offset():
    assert tr("en")("Next step:") == "Next step:" and tr("zh")("Next step:") == "下一步："
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d [+-]\d\d:\d\d", format_when(1_800_000_000.0))
    import datetime as dt
    assert format_when(1_800_000_000.0, dt.timezone(dt.timedelta(hours=8))) == "2027-01-15 16:00 +08:00"


def test_importing_trainguard_messages_does_not_load_gettext():
    code = ("import sys; import trainguard.notify.messages as m; "
            "print('gettext' in sys.modules, 'babel' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO / "daemon")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_zh_test_alert_reaches_the_receiver_with_the_chinese_title_and_next_step(tmp_path):
    with HttpReceiver() as receiver:
        config = tmp_path / "config.toml"
        config.write_text(f"""
[general]
hostname = "gpu3"
state_dir = "{tmp_path / 'state'}"

[notify]
language = "en"

[[notify.targets]]
name = "robot"
url = "json://127.0.0.1:{receiver.port}/hook"
language = "zh"
""")
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'daemon'}:{REPO}"}
        env.pop("TRAINGUARD_CONFIG", None)
        result = subprocess.run([sys.executable, "-m", "trainguard", "test-alert", "--config", str(config)],
                                capture_output=True, text=True, timeout=60, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        doc = receiver.wait_for(1, timeout=10)[0].json()
    assert doc["title"] == "gpu3 测试告警"
    assert "下一步：无需处理；真实告警也是这个样子。" in doc["message"]
    assert doc["key"] == "trainguard.test" and doc["summary"].startswith("test alert")  # JSON fields stay English
