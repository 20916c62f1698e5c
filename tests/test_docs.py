"""The README and docs/ hold together: every relative link and #anchor resolves, and docs/reference.md documents
every config key, finding key and CLI command the code has, each exactly once.

Each check is a function returning its problems, so the tests at the end can show it failing on a copy of the
pages with one fault put in (a broken link, a broken anchor, an undocumented key, a key documented twice).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import unicodedata
from collections import Counter
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest
from pydantic import BaseModel
from trainguard import config
from trainguard.cli import build_parser

from tests.gpu_support import FAKE_DIR, GiB, gpu_spec
from tests.support.cli import cli_env, trainguard
from tests.test_i18n import finding_kinds_in_code

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img [^>]*src=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
ROW_KEY = re.compile(r"^\| `([^`]+)`", re.MULTILINE)


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks: a `# comment` there is no heading, a `[x](y)` no link."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lowercase, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(prose(text)):
        base = slug(heading)
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def broken_links(root: Path) -> list[str]:
    problems = [f"{page.relative_to(root)}: a code block is not closed" for page in pages(root)
                if len(re.findall(r"^(?:```|~~~)", page.read_text(), re.MULTILINE)) % 2]
    for page in pages(root):
        text = INLINE_CODE.sub("", prose(page.read_text()))
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...: not this repository's
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
                problems.append(f"{where}: no heading with that anchor")
    return problems


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def config_keys(model: type[BaseModel] = config.Config, prefix: str = "") -> list[str]:
    """Every key a config file may set: a section's keys (not the section), a list of tables and its keys."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        inner = _models_in(field.annotation)
        if inner != [field.annotation]:
            keys.append(key)
        for item in inner:
            keys += config_keys(item, key + ".")
    return list(dict.fromkeys(keys))


def _models_in(annotation) -> list:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def once(documented: list[str], expected: set[str], what: str) -> list[str]:
    counts = Counter(documented)
    return ([f"{what} not documented: {key}" for key in sorted(expected - set(counts))]
            + [f"{what} documented but not in the code: {key}" for key in sorted(set(counts) - expected)]
            + [f"{what} documented {n} times: {key}" for key, n in counts.items() if n > 1])


GLOBAL = {"-h", "--help", "--config", "-c", "--state-dir"}


def commands() -> dict[str, list[str]]:
    """Subcommand -> its own options and positionals, from the parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and a.dest == "command")
    common = GLOBAL
    return {name: [s for a in parser._actions for s in (a.option_strings or [a.metavar or a.dest.upper()])
                   if s not in common]
            for name, parser in sub.choices.items()}


def reference_problems(root: Path) -> list[str]:
    text = (root / "docs" / "reference.md").read_text()
    problems = once(ROW_KEY.findall(section(text, "Configuration")), set(config_keys()), "config key")
    findings = [key.split(":", 1)[0] for key in ROW_KEY.findall(section(text, "Finding keys"))]
    problems += once(findings, set(finding_kinds_in_code()), "finding key")
    rows = re.findall(r"^\| `trainguard ([a-z-]+)([^`]*)` \|(.*)$", section(text, "CLI commands"), re.MULTILINE)
    problems += once([name for name, _, _ in rows], set(commands()), "CLI command")
    global_options = [s for a in build_parser()._actions for s in a.option_strings if s not in {"-h", "--help"}]
    problems += [f"global option {opt} not documented" for opt in global_options
                 if f"`{opt}" not in section(text, "CLI commands")]
    for name, usage, what in rows:
        problems += [f"CLI command {name}: {opt} not documented" for opt in commands().get(name, [])
                     if opt not in usage + what]
    return problems


def generated_table_problems(root: Path) -> list[str]:
    """The configuration table is what scripts/config-reference makes now, and every key has a meaning."""
    loader = SourceFileLoader("config_reference", str(REPO / "scripts" / "config-reference"))
    tool = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(tool)
    text = (root / "docs" / "reference.md").read_text()
    kept = tool.meanings(text)
    problems = [f"config key without a meaning: {key}" for key, meaning in kept.items() if not meaning.strip()]
    if tool.table(kept) not in text:
        problems.append("docs/reference.md's configuration table differs from `scripts/config-reference`: "
                        "run `PYTHONPATH=daemon scripts/config-reference --write` and write the new meanings")
    return problems


def test_every_link_and_anchor_resolves():
    assert not broken_links(REPO)


def test_the_reference_documents_every_key_and_command_once():
    assert not reference_problems(REPO)


def test_the_configuration_table_is_generated_from_the_models():
    assert not generated_table_problems(REPO)


def test_the_readme_is_a_front_door(tmp_path):
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    example = re.search(r"```toml\n(.*?)```", readme, re.DOTALL)[1]
    assert len(example.splitlines()) <= 10
    (tmp_path / "config.toml").write_text(example)
    loaded = config.load(str(tmp_path / "config.toml"), {}).config  # the example is a valid config
    assert [policy.name for policy in loaded.cleanup] == ["checkpoints"]


def schema_tables(text: str) -> dict[str, set[str]]:
    """The keys of each table of docs/status-json.md: the document's own (""), then each "Each `x[]` object"."""
    def keys(part: str) -> set[str]:
        rows = re.findall(r"^\| (`.*?) \|", part, re.MULTILINE)
        return {key.removesuffix("[]") for row in rows for key in re.findall(r"`([^`]+)`", row)}
    parts = re.split(r"^Each `(\w+)\[\]` object:$", text, flags=re.MULTILINE)
    return {"": keys(parts[0])} | {name: keys(part) for name, part in zip(parts[1::2], parts[2::2])}


def test_the_status_json_schema_documents_every_key(tmp_path):
    """`status --json` with one GPU (NVML faked) and one mount: each key of the document, of a mount and of a
    GPU is in docs/status-json.md, and the page names no key the document lacks."""
    (tmp_path / "nvml.json").write_text(json.dumps({"gpus": [gpu_spec([{"at": 0, "mem_used": 40 * GiB}])]}))
    (tmp_path / "c.toml").write_text(f'[filesystems]\nexclude = ["*"]\npaths = [{str(tmp_path)!r}]\n')
    env = cli_env(TRAINGUARD_FAKE_NVML=str(tmp_path / "nvml.json"))
    env["PYTHONPATH"] = f"{FAKE_DIR}{os.pathsep}{env['PYTHONPATH']}"
    done = trainguard("status", "--json", "--config", str(tmp_path / "c.toml"), "--state-dir",
                      str(tmp_path / "state"), env=env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    documented = schema_tables((REPO / "docs" / "status-json.md").read_text())
    assert documented[""] == set(doc)
    assert documented["filesystems"] == set(doc["filesystems"][0])
    assert documented["gpus"] == set(doc["gpus"][0])


def test_the_install_page_shows_the_readme_commands():
    """docs/install.md repeats the two set-up commands (tests/test_setup.py keeps the README's equal to CI's)."""
    blocks = [re.findall(r"```sh\n(.*?)\n```", (REPO / name).read_text(), re.DOTALL)[:2]
              for name in ("README.md", "docs/install.md")]
    assert blocks[0] == blocks[1] and len(blocks[0]) == 2


def test_the_docs_index_lists_every_page():
    index = (REPO / "docs" / "README.md").read_text()
    listed = {(REPO / "docs" / target).resolve() for target in re.findall(r"\]\(([^)#]+)\)", index)}
    unlisted = [p.relative_to(REPO) for p in pages(REPO)[1:]
                if p.resolve() not in listed and p.parent.name != "runbooks" and p.name != "README.md"]
    assert not unlisted, f"pages missing from docs/README.md: {unlisted}"


def test_github_anchor_rules():
    """Checked by hand against GitHub's rendering of these headings."""
    text = "# A b\n## `trainguard status --json`\n## Before anything hangs: `gpu.risky_write`\n## A b\n## A b\n"
    assert anchors(text) == {"a-b", "trainguard-status---json", "before-anything-hangs-gpurisky_write",
                             "a-b-1", "a-b-2"}
    assert anchors("```\n# not a heading\n```\n") == set()


@pytest.fixture
def pages_copy(tmp_path):
    shutil.copy(REPO / "README.md", tmp_path)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    for name in ("LICENSE", "config.example.toml"):
        shutil.copy(REPO / name, tmp_path)
    assert not broken_links(tmp_path) and not reference_problems(tmp_path)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_broken_link_and_a_broken_anchor_are_found(pages_copy):
    _edit(pages_copy / "README.md", "(docs/cleanup.md)", "(docs/cleanups.md)")
    _edit(pages_copy / "docs" / "README.md", "(reference.md)", "(reference.md#no-such-heading)")
    _edit(pages_copy / "docs" / "reference.md", "(#configuration)", "(#configurations)")
    _edit(pages_copy / "docs" / "cleanup.md", "\n```\n", "\n")
    assert broken_links(pages_copy) == [
        "docs/cleanup.md: a code block is not closed",
        "README.md: docs/cleanups.md: no such file",
        "docs/README.md: reference.md#no-such-heading: no heading with that anchor",
        "docs/reference.md: #configurations: no heading with that anchor",
    ]


def test_an_undocumented_or_twice_documented_key_is_found(pages_copy):
    ref = pages_copy / "docs" / "reference.md"
    _edit(ref, "| `io.for` |", "| `io.for_` |")
    _edit(ref, "| `gpu.orphan:<gpu>:<pid>` |", "| `gpu.stall:<gpu>:<pid>` |")
    _edit(ref, "| `trainguard health [--max-age SECONDS]` |", "| `trainguard health` |")
    _edit(ref, "| `trainguard test-alert [", "| `trainguard mirror [--once] [NAME]` | twice |\n| `trainguard test-alert [")
    assert reference_problems(pages_copy) == [
        "config key not documented: io.for",
        "config key documented but not in the code: io.for_",
        "finding key not documented: gpu.orphan",
        "finding key documented 2 times: gpu.stall",
        "CLI command documented 2 times: mirror",
        "CLI command health: --max-age not documented",
    ]


def test_a_stale_generated_table_is_found(pages_copy):
    ref = pages_copy / "docs" / "reference.md"
    assert not generated_table_problems(pages_copy)
    _edit(ref, "| `general.interval` | `10s` |", "| `general.interval` | `5s` |")
    assert generated_table_problems(pages_copy)[-1].startswith("docs/reference.md's configuration table differs")
    _edit(ref, "| `general.interval` | `5s` | how often a full cycle runs (sample, detect, alert) |",
          "| `general.interval` | `10s` |  |")
    assert generated_table_problems(pages_copy)[0] == "config key without a meaning: general.interval"

