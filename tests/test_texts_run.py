"""What a train.hang and a train.exit say on a phone, in en and zh, with and without the cross-rank
diagnosis's facts."""

from __future__ import annotations

from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.records import Finding, Severity

RANKS = [{"rank": r, "pid": 4122 + r, "gpu": r, "last_progress_ts": 0.0, "cpu_s": 1.0} for r in range(4)]


def hang(**extra) -> Finding:
    return Finding("train.hang:torchrun-4121", Severity.CRITICAL, "s", details={
        "run": "torchrun-4121", "ranks": RANKS, "gpu_evidence": "spinning", "silent_for_s": 720.0,
        "timeout_s": 300.0, "normal_gap_s": 0.0, "last_progress_ts": 0.0, **extra})


def test_the_fact_first_then_the_cause_then_the_next_step():
    zh = texts_for(hang(), tr("zh"))
    assert zh.fact == "训练卡住：torchrun-4121 已 12m 无进展"
    assert "GPU 利用率满但功耗很低" in zh.what and "很可能某个 rank 卡住了" in zh.why
    assert "py-spy dump --pid 4122, 4123, 4124, 4125" in zh.step
    en = texts_for(hang(), tr("en"))
    assert en.fact == "Training hung: torchrun-4121 no progress for 12m"
    assert en.what.startswith("Training run torchrun-4121 (4 ranks) has made no progress for 12m (timeout 5m).")


def test_the_rank_that_holds_the_others_is_named_when_the_diagnosis_found_it():
    holder = {"rank": 2, "pid": 4124, "frame": "DataLoader.__next__", "file": "/root/autodl-fs/x.bin",
              "mount": "/root/autodl-fs"}
    f = hang(holder=holder, waiting_ranks=[0, 1, 3], collective="all_reduce",
             stalls=[{"gpu": 2, "stalled_for_s": 600.0}])
    en = texts_for(f, tr("en"))
    assert en.why == ("Rank 2 (PID 4124) is in DataLoader.__next__ reading /root/autodl-fs/x.bin; "
                      "ranks 0, 1, 3 wait in all_reduce.")
    assert "GPU 2 also stalled" in en.what
    zh = texts_for(f, tr("zh"))
    assert zh.why == "rank 2（PID 4124）停在 DataLoader.__next__，正在读 /root/autodl-fs/x.bin；rank 0, 1, 3 在 all_reduce 中等待。"


def test_an_exit_says_how_the_run_ended():
    f = Finding("train.exit:torchrun-4121", Severity.WARNING, "s", details={
        "run": "torchrun-4121", "error": "[rank0]: RuntimeError: loss is nan at step 7"})
    zh = texts_for(f, tr("zh"))
    assert zh.fact == "训练 torchrun-4121 出错退出" and "RuntimeError: loss is nan" in zh.what
    assert not texts_for(f, tr("en")).fallback
    killed = Finding("train.exit:torchrun-4121", Severity.WARNING, "s", details={
        "run": "torchrun-4121", "how": "killed", "error": "traceback : Signal 9 (SIGKILL) received by PID 4122"})
    assert texts_for(killed, tr("en")).fact == "Training torchrun-4121 was killed"
    assert texts_for(killed, tr("zh")).fact == "训练 torchrun-4121 被终止"


def test_a_hang_the_rank_diagnosis_enriched_renders_its_verdict_and_next_steps_in_both_languages():
    """The keys the cross-rank diagnosis adds (verdict, holder, collective, waiting_ranks, stacks) as it
    writes them, rendered through the phone texts: no language may fall back or fail."""
    holder = {"rank": 2, "pid": 4124, "frame": "DataLoader.__next__", "at": "Shard.__getitem__ (data.py:10)",
              "file": "/root/autodl-fs/x.bin", "mount": "/root/autodl-fs", "kind": "io", "state": "D"}
    diagnosed = {
        "rank_holds_collective": hang(verdict="rank_holds_collective", holder=holder, waiting_ranks=[0, 1, 3],
                                      collective="all_reduce"),
        "all_in_collective": hang(verdict="all_in_collective", waiting_ranks=[0, 1, 2, 3], collective="all_reduce",
                                  stacks="missing"),
    }
    for verdict, f in diagnosed.items():
        for lang in ("en", "zh"):
            texts = texts_for(f, tr(lang))
            assert not texts.fallback and texts.why and "NCCL_DEBUG=WARN" in texts.step, (verdict, lang, texts)
    en = texts_for(diagnosed["all_in_collective"], tr("en"))
    assert "none holds them" in en.why and "py-spy is not installed" in en.why
    assert "/root/autodl-fs" in texts_for(diagnosed["rank_holds_collective"], tr("zh")).step
