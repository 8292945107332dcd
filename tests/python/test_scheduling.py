"""The daemon's niceness (config key `nice`, server/scheduling.h): every
thread of a real gradd runs at it, except a single-node job's engine thread
(at the trainers' niceness); without CAP_SYS_NICE the daemon warns and
keeps the niceness it was started with, and still serves."""
import collections
import os
import shutil
import subprocess
import threading
import time

import pytest

from conftest import Daemon

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def thread_niceness(pid):
    """{tid: niceness} of every thread of `pid` (field 19 of /proc/.../stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            # The thread ended between the listing and the read (a gRPC
            # worker or a job's engine thread going away): it has no
            # niceness any more, so it is not counted.
            continue
        out[int(tid)] = int(fields[16])  # fields[0] is field 3 (state)
    return out


def config_file(tmp_path, text):
    path = tmp_path / "gradd.yaml"
    path.write_text(text)
    return str(path)


def test_every_thread_runs_at_the_configured_raised_niceness(gradd_binary, tmp_path):
    # Raising the niceness needs no privilege: this holds for any user.
    d = Daemon(gradd_binary, ["--config", config_file(tmp_path, "nice: 7\n")])
    try:
        nice = thread_niceness(d.proc.pid)
        assert len(nice) > 1, nice  # the daemon's own threads, not just main
        assert set(nice.values()) == {7}, nice
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering the niceness needs root")
def test_default_is_minus_ten_on_every_thread(gradd_binary):
    d = Daemon(gradd_binary)
    try:
        assert set(thread_niceness(d.proc.pid).values()) == {-10}
    finally:
        d.stop()


def wait_for_niceness(pid, want, timeout=10.0):
    """Polls until the daemon's threads count `want` ({niceness: threads});
    returns the last {niceness: threads} seen."""
    deadline = time.monotonic() + timeout
    while True:
        seen = dict(collections.Counter(thread_niceness(pid).values()))
        if all(seen.get(n, 0) == k for n, k in want.items()) or time.monotonic() > deadline:
            return seen


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering the niceness needs root")
def test_a_single_node_jobs_engine_thread_runs_at_the_trainers_niceness(gradd_binary, job_id):
    import gradd  # the built package (PYTHONPATH), as in test_client.py

    d = Daemon(gradd_binary)
    attached = threading.Barrier(3, timeout=60)
    checked = threading.Event()
    errors = []

    def rank_fn(rank):
        try:
            c = gradd.attach([("w", (1000,), "float32")], socket=d.socket, job_id=job_id,
                             local_rank=rank, local_world_size=2)
            try:
                attached.wait()
                checked.wait(60)
            finally:
                c.detach()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            attached.abort()

    threads = [threading.Thread(target=rank_fn, args=(r,), daemon=True) for r in range(2)]
    try:
        before = dict(collections.Counter(thread_niceness(d.proc.pid).values()))
        assert set(before) == {-10}, before
        for t in threads:
            t.start()
        try:
            attached.wait()
        except threading.BrokenBarrierError:
            pytest.fail(f"the ranks did not attach: {errors}")
        # The job's engine thread, and only it, left -10 for 0.
        during = wait_for_niceness(d.proc.pid, {0: 1})
        assert during.get(0) == 1 and set(during) == {-10, 0}, during
        checked.set()
        for t in threads:
            t.join(60)
        assert not errors, errors
        # The job ended with its ranks: every thread left is at -10.
        after = wait_for_niceness(d.proc.pid, {0: 0})
        assert set(after) == {-10}, after
    finally:
        checked.set()
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and util-linux's setpriv to drop CAP_SYS_NICE")
def test_without_cap_sys_nice_it_warns_and_serves(gradd_binary, tmp_path):
    wrapper = tmp_path / "gradd-no-nice"
    wrapper.write_text("#!/bin/sh\nexec setpriv --bounding-set -sys_nice "
                       f"{gradd_binary} \"$@\"\n")
    wrapper.chmod(0o755)
    d = Daemon(str(wrapper), ["--config", config_file(tmp_path, "nice: -5\n")])
    try:
        assert set(thread_niceness(d.proc.pid).values()) == {0}
        log = d.log()
        assert "cannot set the daemon's niceness from 0 to -5" in log, log
        assert "CAP_SYS_NICE" in log, log
        # Still serving: the admin health check answers.
        graddctl = os.environ.get("GRADDCTL_BINARY")
        if graddctl:
            r = subprocess.run([graddctl, "--socket", d.socket, "health"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        d.stop()
