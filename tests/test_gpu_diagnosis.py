"""The stall diagnosis on real processes: a trainer whose writer thread is stuck writing
TensorBoard events to a hung FUSE mount, reported as the GPU holder by the fake NVML."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from trainguard.diagnosis.stall import StallDiagnoser, parse_py_spy_dump, render
from trainguard.records import FsSample, LogMatch, Mount, MountKind, Snapshot
from trainguard.sources import procs
from trainguard.sources.gpu import GpuSampler

from tests.gpu_support import FakeClock, GiB, fake_pynvml, gpu_spec

TRAINER = textwrap.dedent("""
    import sys, threading
    fh = open(sys.argv[1], "ab", buffering=0)
    def writer():
        print(threading.get_native_id(), flush=True)
        sys.stdin.readline()
        fh.write(b"event" * 100)   # blocks while the mount's write is held
        print("written", flush=True)
    t = threading.Thread(target=writer, name="EventFileWriter")
    t.start()
    t.join()
""")


@pytest.fixture
def stuck_trainer(slowfs):
    runs = slowfs.mountpoint / "runs" / "x"
    runs.mkdir(parents=True)
    events = runs / "events.out.tfevents.1700000000.host.1234.0"
    child = subprocess.Popen([sys.executable, "-c", TRAINER, str(events)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        writer_tid = int(child.stdout.readline())
        slowfs.block("write")
        child.stdin.write("go\n")
        child.stdin.flush()
        slowfs.wait_blocked("write", timeout=10)
        yield child, writer_tid, events, slowfs
    finally:
        slowfs.unblock("all")
        child.kill()
        child.wait(timeout=10)


def _gpu_holding(pid: int):
    clock = FakeClock()
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB,
                                                     "processes": [{"pid": pid, "used": 76 * GiB}]}])]},
                                clock=clock)
    sampler = GpuSampler(nvml, clock=clock, xid_events=False)
    try:
        return clock, sampler.sample().gpus[0]
    finally:
        sampler.close()


def test_blocked_fuse_write_is_attributed_to_thread_file_and_mount(stuck_trainer):
    child, writer_tid, events, fs = stuck_trainer
    clock, gpu = _gpu_holding(child.pid)
    assert gpu.processes[0].pid == child.pid
    # The mount probe (foundation) says the mount stopped answering 7 minutes ago.
    mount = Mount(str(fs.mountpoint), fs.fstype, fs.source, 0, 0, MountKind.FUSE)
    probe = FsSample(mount, clock.now, None, responsive=False, unresponsive_since=clock.now - 420)
    log = LogMatch("/root/train.log", "FileNotFoundError: [Errno 2] No such file: 'runs/x/events.out.tfevents'",
                   "FileNotFoundError.*tfevents", clock.now)
    snapshot = Snapshot(ts=clock.now, filesystems=(probe,), gpus=(gpu,), log_matches=(log,))
    diagnoser = StallDiagnoser(py_spy=False, clock=clock)
    diagnoser.observe(snapshot)
    d = diagnoser.diagnose(gpu, snapshot, clock.now)

    (view,) = d.processes
    assert view.host_pid == child.pid and view.resolved
    blocked = {t.tid: t for t in view.blocked_threads}
    assert writer_tid in blocked, view.blocked_threads
    thread = blocked[writer_tid]
    # Measured: a write to a hung FUSE mount sleeps in request_wait_answer (S or D).
    assert thread.state in ("S", "D") and thread.wchan
    assert procs.is_blocked(thread.state, thread.wchan)
    assert thread.syscall == "write" and thread.file == str(events)
    assert view.remote_files[0].path == str(events) and view.remote_files[0].category == "tfevents"
    assert view.remote_files[0].fstype == fs.fstype
    assert d.verdict.startswith(f"PID {child.pid} [python") and " thread " in d.verdict
    assert f"blocked writing {events} on {fs.fstype} at {fs.mountpoint}, mount unresponsive 7m" in d.verdict
    assert d.attribution == "nvml"
    assert "local disk" in d.remedy and "flush_secs" in d.remedy
    assert d.log_lines == (log,)
    text = render(d)
    assert "EventFileWriter" not in text or thread.name == "EventFileWriter"
    assert str(events) in text and "verdict:" in text
    # Nothing was written while blocked: the I/O window shows no progress.
    clock.advance(30)
    d2 = diagnoser.diagnose(gpu, snapshot, clock.now)
    assert d2.processes[0].io_moved is False


def test_stall_finding_is_enriched_with_the_diagnosis(stuck_trainer):
    child, _tid, events, fs = stuck_trainer
    from trainguard.records import Finding, Severity
    clock, gpu = _gpu_holding(child.pid)
    snapshot = Snapshot(ts=clock.now, gpus=(gpu,))
    stall = Finding("gpu.stall:0", Severity.CRITICAL, "GPU 0 stalled", details={"gpu": 0, "util_recent": [0.0]})
    (enriched,) = StallDiagnoser(py_spy=False).enrich([stall], snapshot, clock.now)
    assert enriched.details["verdict"] in enriched.summary and str(events) in enriched.summary
    assert enriched.details["diagnosis"]["processes"][0]["host_pid"] == child.pid
    assert "local disk" in enriched.hint


def test_unresolvable_pid_is_said_and_not_inspected():
    clock = FakeClock()
    nvml = fake_pynvml.FakeNvml({"gpus": [gpu_spec([{"at": 0, "util": 0, "mem_used": 76 * GiB,
                                                     "processes": [{"pid": os.getpid(), "used": GiB}]}])]},
                                clock=clock)
    gpu = GpuSampler(nvml, clock=clock, host_pid_view=False, xid_events=False).sample().gpus[0]
    d = StallDiagnoser(py_spy=False).diagnose(gpu, Snapshot(ts=clock.now, gpus=(gpu,)), clock.now)
    assert not d.processes[0].resolved and d.processes[0].blocked_threads == ()
    assert d.verdict.startswith("cannot inspect the GPU's processes") and "host PID" in d.verdict


def test_idle_process_without_blocked_io_gets_a_stack_dump_hint():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        clock, gpu = _gpu_holding(sleeper.pid)
        time.sleep(0.2)
        d = StallDiagnoser(py_spy=False).diagnose(gpu, Snapshot(ts=clock.now, gpus=(gpu,)), clock.now)
        assert d.processes[0].blocked_threads == ()
        assert "no thread blocked on I/O" in d.verdict and "py-spy dump" in d.remedy
    finally:
        sleeper.kill()
        sleeper.wait()


def test_py_spy_dump_names_python_threads():
    text = ('[{"pid": 7, "thread_id": 1, "thread_name": "EventFileWriter", "os_thread_id": 4242, "active": false,'
            ' "owns_gil": false, "frames": [{"name": "write", "filename": "/x/event_file_writer.py", "line": 233}]},'
            ' {"pid": 7, "thread_id": 2, "thread_name": "MainThread", "os_thread_id": 7, "frames": []}]')
    assert parse_py_spy_dump(text) == {4242: ("EventFileWriter", "event_file_writer.py:233 write"),
                                       7: ("MainThread", "")}
    assert parse_py_spy_dump("not json") == {}


@pytest.mark.parametrize("text,expected", [
    ("1 0x5 0x7f00 0x10 0x0 0x0 0x0 0x7ffd 0x7f01", ("write", 5)),
    ("74 0x3 0 0 0 0 0 0x7ffd 0x7f01", ("fsync", 3)),
    ("137 0x55aa 0x7ffd 0 0 0 0 0x7ffd 0x7f01", ("statfs", None)),
    ("running", ("", None)),
])
def test_syscall_parsing_x86_64(text, expected):
    assert procs.parse_syscall(text, "x86_64") == expected


@pytest.mark.parametrize("state,wchan,blocked", [
    ("D", "", True), ("S", "request_wait_answer", True), ("S", "rpc_wait_bit_killable", True),
    ("D", "nfs_wait_on_request", True), ("S", "do_epoll_wait", False), ("S", "futex_wait_queue", False),
    ("R", "", False),
])
def test_blocked_means_d_state_or_a_filesystem_wait(state, wchan, blocked):
    assert procs.is_blocked(state, wchan) is blocked


def test_diagnose_command_in_a_subprocess_with_the_fake_on_pythonpath(tmp_path):
    import json

    from tests.gpu_support import FAKE_DIR
    heartbeat = tmp_path / "heartbeat"
    heartbeat.write_text("")
    # Generous lifetimes: on a loaded machine the CLI may take a long while to start, and the
    # heartbeat must still count as fresh and the holder still be alive when it looks.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
    try:
        script = {"gpus": [gpu_spec([{"at": 0, "mem_used": 76 * GiB,
                                      "processes": [{"pid": holder.pid, "used": 76 * GiB}]}],
                                    heartbeat={"path": str(heartbeat), "fresh_s": 900, "busy": 97, "idle": 0})]}
        (tmp_path / "nvml.json").write_text(json.dumps(script))
        daemon_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "daemon")
        env = dict(os.environ, PYTHONPATH=f"{FAKE_DIR}{os.pathsep}{daemon_dir}",
                   TRAINGUARD_FAKE_NVML=str(tmp_path / "nvml.json"))
        out = subprocess.run([sys.executable, "-m", "trainguard", "diagnose", "0", "--json", "--wait", "0.2",
                              "--state-dir", str(tmp_path / "state")],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        (d,) = json.loads(out.stdout)["gpus"]
        assert d["processes"][0]["host_pid"] == holder.pid and d["processes"][0]["resolved"]
        assert d["util_recent"] == [0.97]  # heartbeat fresh: the fake reports the job as computing
        assert "no thread blocked on I/O" in d["verdict"]
        assert d["processes"][0]["owner"]["uid"] == os.getuid()  # whose it is (here: no container, no job)
    finally:
        holder.kill()
        holder.wait()
