"""Alert delivery figures, each against a reference measured in the same run.

1. Latency: a finding fires (notify() returns) -> the HTTP receiver on 127.0.0.1 has the
   message, with the default group_wait (0). Reference: one bare HTTP POST to the same receiver.
2. Outbox throughput: N alerts queued while the target is down, then it comes back; alerts
   per second delivered (rate limit off). Reference: the same N alerts into a target that was up.
3. Daemon start-up time and RSS, with and without a notify target (apprise must not load
   before the first send). Reference: bare `python -c pass`.

    PYTHONPATH=daemon:. python bench/notify_bench.py [--backlog 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "daemon"), str(REPO)]

from trainguard import config  # noqa: E402
from trainguard.notify.worker import OutboxNotifier  # noqa: E402
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity  # noqa: E402
from trainguard.store.state import StateDb  # noqa: E402

from tests.support.http_receiver import HttpReceiver  # noqa: E402


def event(i: int) -> AlertEvent:
    now = time.time()
    f = Finding(f"fs.usage:/data{i}", Severity.WARNING, f"/data{i} 91.0% full, 3.0 GiB free",
                details={"mountpoint": f"/data{i}", "avail_bytes": 3 * 2**30})
    return AlertEvent(AlertStatus.FIRING, f, started_at=now, ts=now)


def notify_cfg(port: int, **extra) -> config.Notify:
    return config.parse({"notify": {"targets": [{"name": "hook", "url": f"json://127.0.0.1:{port}/h"}],
                                    **extra}}, "bench").notify


def latency(rounds: int) -> None:
    with HttpReceiver() as receiver, tempfile.TemporaryDirectory() as state:
        bare = []
        for _ in range(rounds):
            t = time.monotonic()
            urllib.request.urlopen(urllib.request.Request(receiver.url + "/ref", data=b"{}", method="POST")).read()
            bare.append(time.monotonic() - t)
        receiver.clear()
        # Each round stands for an alert after a quiet spell: group_interval (which holds back alerts
        # that follow a message closely) is off so the rounds need not wait for it; group_wait is the default 0.
        notifier = OutboxNotifier(StateDb(state), notify_cfg(receiver.port, group_interval="0s"), "bench")
        notifier.notify([event(-1)])  # first send loads apprise: reported separately
        t0 = time.monotonic()
        receiver.wait_for(1, 30)
        first = receiver.requests[0].arrived_at - t0
        samples = []
        for i in range(rounds):
            receiver.clear()
            t = time.monotonic()
            notifier.notify([event(i)])
            (req,) = receiver.wait_for(1, 30)
            samples.append(req.arrived_at - t)
        notifier.close()
    print(f"latency finding -> receiver: median {statistics.median(samples) * 1000:.1f} ms, "
          f"max {max(samples) * 1000:.1f} ms over {rounds} (first send incl. apprise import {first * 1000:.0f} ms); "
          f"bare POST median {statistics.median(bare) * 1000:.2f} ms; ratio "
          f"{statistics.median(samples) / statistics.median(bare):.1f}x; target < 2000 ms")


def throughput(n: int) -> None:
    def run(down: bool) -> tuple[float, int]:
        with HttpReceiver() as receiver, tempfile.TemporaryDirectory() as state:
            port = receiver.port
            if down:
                receiver.stop()
            notifier = OutboxNotifier(StateDb(state), notify_cfg(port, group_interval="0s", retry_initial="1s",
                                                                  retry_max="1s", max_pending=n + 10), "bench")
            batch = 100
            for i in range(0, n, batch):
                notifier.notify([event(j) for j in range(i, min(n, i + batch))])
            if down:
                time.sleep(0.5)  # at least one failed attempt, so the backlog is really queued
                receiver.start()
            t = time.monotonic()
            deadline = t + 600
            conn = StateDb(state).connect()
            while time.monotonic() < deadline:
                (left,) = conn.execute("SELECT COUNT(*) FROM outbox WHERE state = 'pending'").fetchone()
                if left == 0:
                    break
                time.sleep(0.05)
            took = time.monotonic() - t
            alerts = sum(len(r.json()["alerts"]) for r in receiver.requests if r.status == 200)
            messages = len([r for r in receiver.requests if r.status == 200])
            notifier.close()
            assert alerts == n, f"{alerts} of {n} delivered"
            return took, messages

    up_s, up_msgs = run(down=False)
    down_s, down_msgs = run(down=True)
    print(f"outbox backlog of {n} alerts after the target came back: {n / down_s:,.0f} alerts/s "
          f"({down_msgs} messages, {down_s:.2f} s incl. up to 1 s of retry backoff); "
          f"reference with the target up: {n / up_s:,.0f} alerts/s ({up_msgs} messages); ratio {up_s / down_s:.2f}")


def startup() -> None:
    def measure(code: str, env: dict) -> tuple[float, float]:
        times, rss = [], []
        for _ in range(3):
            t = time.monotonic()
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            times.append(time.monotonic() - t)
            rss.append(float(out.stdout.strip().splitlines()[-1]))
        return statistics.median(times), statistics.median(rss)

    rss_code = ("print([int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmRSS')][0])")
    env = {**os.environ, "PYTHONPATH": str(REPO / "daemon")}
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp, "plain.toml")
        plain.write_text(f'[general]\nstate_dir = "{tmp}/s1"\n')
        target = Path(tmp, "target.toml")
        target.write_text(f'[general]\nstate_dir = "{tmp}/s2"\n[[notify.targets]]\nname = "x"\n'
                          f'url = "json://127.0.0.1:9/x"\n')
        daemon = ("import sys\nfrom trainguard import config\nfrom trainguard.service.daemon import Daemon\n"
                  "d = Daemon(config.load({path!r}))\nd.cycle()\nloaded = 'apprise' in sys.modules\n"
                  "{extra}d.close()\nassert not loaded, 'apprise loaded at start-up'\n" + rss_code)
        ref_t, ref_rss = measure(rss_code, env)
        no_t, no_rss = measure(daemon.format(path=str(plain), extra=""), env)
        yes_t, yes_rss = measure(daemon.format(path=str(target), extra=""), env)
        with_apprise = daemon.format(path=str(target), extra="import apprise\nloaded = False\n")
        ap_t, ap_rss = measure(with_apprise, env)
    print(f"start-up (import + first cycle): bare python {ref_t * 1000:.0f} ms / {ref_rss:.1f} MiB; "
          f"no target {no_t * 1000:.0f} ms / {no_rss:.1f} MiB; with a target {yes_t * 1000:.0f} ms / {yes_rss:.1f} MiB "
          f"(ratio {yes_t / no_t:.2f}x time, {yes_rss / no_rss:.2f}x RSS); "
          f"if apprise were imported eagerly: {ap_t * 1000:.0f} ms / {ap_rss:.1f} MiB")


def main() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)  # the retries of the backlog run are expected
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    latency(args.rounds)
    throughput(args.backlog)
    startup()


if __name__ == "__main__":
    main()
