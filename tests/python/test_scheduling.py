"""The daemon's niceness (config key `nice`, server/scheduling.h): every
thread of a real gradd runs at it; without CAP_SYS_NICE the daemon warns and
keeps the niceness it was started with, and still serves."""
import os
import shutil
import subprocess

import pytest

from conftest import Daemon

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def thread_niceness(pid):
    """{tid: niceness} of every thread of `pid` (field 19 of /proc/.../stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
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
