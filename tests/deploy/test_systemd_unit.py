"""deploy/systemd/gradd.service: a valid Type=notify unit, hardened to a
`systemd-analyze security` exposure of at most 2.0 without taking away what
gradd needs. Runs systemd-analyze offline (no systemd needed as PID 1)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "gradd.service"
MAX_EXPOSURE = 2.0

analyze = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(
    analyze is None, reason="systemd-analyze not installed (Debian: systemd)")


def parse_unit(text):
    """{section: {key: [values]}} of a unit file (comments dropped)."""
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def gradd_binary():
    binary = os.environ.get("GRADD_BINARY", str(REPO / "build/server/gradd"))
    if not os.access(binary, os.X_OK):
        pytest.skip(f"gradd binary {binary} not built (set GRADD_BINARY)")
    return os.path.abspath(binary)


@pytest.fixture
def unit_copy(tmp_path):
    """The unit with ExecStart pointing at the built gradd, so verify can
    check the command exists."""
    text = UNIT.read_text()
    assert "/usr/local/bin/gradd " in text
    path = tmp_path / "gradd.service"
    path.write_text(text.replace("/usr/local/bin/gradd ",
                                 gradd_binary() + " "))
    return path


def run(*args):
    return subprocess.run([analyze, *args], capture_output=True, text=True,
                          timeout=60)


def test_verify_passes_without_warnings(unit_copy):
    r = run("verify", str(unit_copy))
    assert r.returncode == 0, r.stderr
    # verify only warns about unknown keys and bad values: none allowed.
    complaints = [l for l in r.stderr.splitlines() if unit_copy.name in l]
    assert complaints == [], r.stderr


def test_verify_catches_a_bad_key(unit_copy):
    """The check above can fail: a misspelt key is reported."""
    unit_copy.write_text(unit_copy.read_text().replace(
        "NoNewPrivileges=yes", "NoNewPrivilege=yes"))
    r = run("verify", str(unit_copy))
    assert "NoNewPrivilege" in r.stderr


def exposure(unit_path):
    r = run("security", "--offline=yes", str(unit_path))
    assert r.returncode == 0, r.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout
    return float(m.group(1))


def test_exposure_at_most_2(unit_copy):
    level = exposure(unit_copy)
    assert level <= MAX_EXPOSURE, (
        f"exposure {level} > {MAX_EXPOSURE}: see `systemd-analyze security "
        f"--offline=yes {UNIT}`")


def test_exposure_measure_reacts_to_hardening(unit_copy):
    """Without its hardening block the same unit scores much worse, so the
    figure above measures this file."""
    text = unit_copy.read_text()
    head = text.split("# Hardening")[0]
    unit_copy.write_text(head + "\n[Install]\nWantedBy=multi-user.target\n")
    assert exposure(unit_copy) > 5.0


def test_keeps_what_gradd_needs():
    service = parse_unit(UNIT.read_text())["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["WatchdogSec"] and service["WatchdogSec"][0] != "0"
    assert service["RuntimeDirectory"] == ["gradd"]
    assert service["RuntimeDirectoryMode"] == ["0700"]
    families = " ".join(service["RestrictAddressFamilies"]).split()
    # Trainers (Unix sockets, SCM_RIGHTS); rendezvous, Gloo and /metrics.
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)
    assert "PrivateNetwork" not in service
    # memfd_create lives in @ipc, part of @system-service; setrlimit in
    # @resources, also part of it.
    assert "@system-service" in service["SystemCallFilter"]
    denied = [v for v in service["SystemCallFilter"] if v.startswith("~")]
    assert all("@ipc" not in v and "@resources" not in v for v in denied)
    # GPUs stay reachable: no PrivateDevices, the NVIDIA devices allowed.
    assert service.get("PrivateDevices", ["no"]) == ["no"]
    assert any("nvidia" in v for v in service["DeviceAllow"])
    assert service["KillSignal"] == ["SIGTERM"]
