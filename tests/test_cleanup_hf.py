"""The Hugging Face hub cache, revision-aware, on real refs/snapshots/blobs symlink trees."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.test_cleanup import DAY, holder, make, names, policy, runner


def blob(repo: Path, name: str, size: int, used_days_ago: float) -> Path:
    path = repo / "blobs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"b" * size)
    t = time.time() - used_days_ago * DAY
    os.utime(path, (t, t))
    return path


def snapshot(repo: Path, commit: str, files: dict[str, str]) -> None:
    for rel, blob_name in files.items():
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        depth = rel.count("/")
        link.symlink_to("../" * (2 + depth) + f"blobs/{blob_name}")


def hf_repo(root: Path, name: str, recent_days: float, old_days: float) -> Path:
    """main -> aaaa (config shared with the detached bbbb); bbbb detached with its own weights."""
    repo = root / name
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("aaaa")
    t = time.time() - old_days * DAY  # the ref was written when the revision was downloaded
    os.utime(repo / "refs" / "main", (t, t))
    blob(repo, "shared", 1000, recent_days)
    blob(repo, "w_main", 8000, recent_days)
    blob(repo, "w_old", 8000, old_days)
    snapshot(repo, "aaaa", {"config.json": "shared", "model.safetensors": "w_main"})
    snapshot(repo, "bbbb", {"config.json": "shared", "sub/model.safetensors": "w_old"})
    return repo


def test_detached_revisions_and_their_own_blobs_go_first(tmp_path):
    hub = tmp_path / "hub"
    repo = hf_repo(hub, "models--org--m", recent_days=0.5, old_days=30)
    report = runner(tmp_path, 0).run(policy(type="huggingface-cache", roots=[str(hub)], older_than="7d", grace="0s"))
    left = names(repo)
    assert "snapshots/bbbb" not in left and "blobs/w_old" not in left
    assert {"blobs/shared", "blobs/w_main", "snapshots/aaaa/config.json", "refs/main"} <= left
    assert os.path.exists(repo / "snapshots" / "aaaa" / "config.json")  # the link still resolves
    assert report.bytes >= 8000 and any("detached revision bbbb" in i.reason for i in report.items)


def test_whole_repos_go_by_last_use_when_every_revision_is_old(tmp_path):
    hub = tmp_path / "hub"
    hf_repo(hub, "models--org--old", recent_days=40, old_days=50)
    hf_repo(hub, "models--org--new", recent_days=1, old_days=50)
    runner(tmp_path, 0).run(policy(type="huggingface-cache", roots=[str(hub)], older_than="7d", grace="0s"))
    assert names(hub) & {"models--org--old"} == set()
    assert "models--org--new/snapshots/aaaa" in names(hub) and "models--org--new/blobs/w_old" not in names(hub)


def test_a_repo_open_by_a_process_is_never_touched(tmp_path):
    hub = tmp_path / "hub"
    repo = hf_repo(hub, "models--org--busy", recent_days=40, old_days=50)
    before = names(repo)
    with holder(repo / "snapshots" / "aaaa" / "model.safetensors", "open"), holder(repo / "blobs" / "w_old", "open"):
        report = runner(tmp_path, 0).run(policy(type="huggingface-cache", roots=[str(hub)], older_than="7d",
                                                grace="0s"))
    assert names(repo) == before and report.files == 0 and report.skipped.get("open", 0) >= 1


def test_the_layout_read_agrees_with_huggingface_hub(tmp_path):
    scan_cache_dir = pytest.importorskip("huggingface_hub").scan_cache_dir
    hub = tmp_path / "hub"
    repo = hf_repo(hub, "models--org--m", recent_days=0.5, old_days=30)
    (repo / "refs" / "pr").mkdir()
    (repo / "refs" / "pr" / "1").write_text("cccc")  # a ref below refs/ still counts
    snapshot(repo, "cccc", {"model.safetensors": "w_pr"})
    blob(repo, "w_pr", 100, 30)
    info = scan_cache_dir(hub)
    (hf,) = info.repos
    detached_by_hub = {r.commit_hash for r in hf.revisions if not r.refs}
    assert detached_by_hub == {"bbbb"}
    runner(tmp_path, 0).run(policy(type="huggingface-cache", roots=[str(hub)], older_than="7d", grace="0s"))
    left = {p.name for p in (repo / "snapshots").iterdir()}
    assert left == {r.commit_hash for r in hf.revisions} - detached_by_hub


def test_a_recent_detached_revision_stays_until_space_is_needed(tmp_path):
    hub = tmp_path / "hub"
    repo = hf_repo(hub, "models--org--pinned", recent_days=0.5, old_days=2)  # bbbb used two days ago
    runner(tmp_path, 0).run(policy(type="huggingface-cache", roots=[str(hub)], older_than="7d", grace="0s"))
    assert "snapshots/bbbb" in names(repo)  # maybe pinned by commit hash: not old enough
    # 24 KiB of files (three blobs and the ref, 4 KiB blocks): 8 KiB over the cap, what the detached revision
    # frees. (A smaller cap rightly takes the whole repo after it.)
    runner(tmp_path, 0).run(policy(type="huggingface-cache", roots=[str(hub)], max_size="16KiB", grace="0s"))
    assert "snapshots/bbbb" not in names(repo) and "blobs/w_old" not in names(repo)
    assert "snapshots/aaaa" in names(repo)  # the detached revision went first, the repo fits now


def test_the_datasets_cache_goes_a_dataset_at_a_time(tmp_path):
    cache = tmp_path / "hf" / "datasets"
    for name, age in (("glue", 40), ("imdb", 1)):
        for rel in ("default/0.0.0/abc/train.arrow", "default/0.0.0/abc/dataset_info.json"):
            make(cache / name / rel, 4096, age=age * DAY)
    make(cache / "downloads" / "f00d", 4096, age=30 * DAY)
    env = {"HF_DATASETS_CACHE": str(cache), "HOME": str(tmp_path)}
    pol = policy(type="huggingface-datasets-cache", older_than="7d", all_users=False, grace="0s")
    report = runner(tmp_path, 0, environ=env).run(pol)
    assert {p.name for p in cache.iterdir()} == {"imdb"}
    assert (cache / "imdb" / "default/0.0.0/abc/train.arrow").exists() and report.files == 3
