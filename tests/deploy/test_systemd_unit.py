"""deploy/systemd/gradd.service: a valid Type=notify unit, hardened to a
`systemd-analyze security` exposure of at most 2.0 without taking away what
gradd needs. Runs systemd-analyze offline (no systemd needed as PID 1)."""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "gradd.service"
MAX_EXPOSURE = 2.0

analyze = shutil.which("systemd-analyze")


@pytest.fixture(autouse=True)
def _systemd_analyze():
    """scripts/setup installs systemd: without systemd-analyze every test
    here fails, saying so."""
    if analyze is None:
        pytest.fail("systemd-analyze not installed (Debian: systemd, which "
                    "scripts/setup installs)", pytrace=False)


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
        pytest.fail(f"gradd binary {binary} not built (set GRADD_BINARY)",
                    pytrace=False)
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


# ---- the multi-node drop-in (issue 20) ---------------------------------------

DROPIN = REPO / "deploy" / "systemd" / "gradd-multinode.conf"


def test_reload_sends_sighup():
    """`systemctl reload gradd` re-reads the daemon credentials."""
    service = parse_unit(UNIT.read_text())["Service"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]


def test_multinode_dropin_passes_every_loaded_credential():
    service = parse_unit(DROPIN.read_text())["Service"]
    loaded = {v.split(":", 1)[0]: v.split(":", 1)[1]
              for v in service["LoadCredential"]}
    assert all(path.startswith("/etc/gradd/credentials/")
               for path in loaded.values())
    # ExecStart is replaced, not added to.
    assert service["ExecStart"][0] == ""
    (command,) = service["ExecStart"][1:]
    args = command.split()
    assert args[0] == "/usr/local/bin/gradd"
    used = {a.split("%d/", 1)[1] for a in args if "%d/" in a}
    assert used == set(loaded)
    for flag in ("--rendezvous-token-file", "--rendezvous-tls-cert",
                 "--rendezvous-tls-key", "--rendezvous-tls-ca"):
        assert any(a.startswith(flag + "=%d/") for a in args), flag


@pytest.fixture
def unit_with_dropin(unit_copy):
    dropin_dir = unit_copy.parent / "gradd.service.d"
    dropin_dir.mkdir()
    (dropin_dir / "multinode.conf").write_text(DROPIN.read_text().replace(
        "/usr/local/bin/gradd ", gradd_binary() + " "))
    return unit_copy


def test_verify_passes_with_the_dropin(unit_with_dropin):
    r = run("verify", str(unit_with_dropin))
    assert r.returncode == 0, r.stderr
    complaints = [l for l in r.stderr.splitlines()
                  if "gradd.service" in l or "multinode.conf" in l]
    assert complaints == [], r.stderr


def test_the_dropins_command_starts_a_daemon_with_both_credentials(tmp_path):
    """The drop-in's ExecStart, with %d a credentials directory as systemd
    would fill it: gradd starts with mutual TLS and the token."""
    binary = gradd_binary()
    creds = tmp_path / "credentials"
    script = REPO / "tests" / "tools" / "make_test_certs.sh"
    subprocess.run(["sh", str(script), str(tmp_path / "certs")], check=True,
                   timeout=60)
    creds.mkdir()
    service = parse_unit(DROPIN.read_text())["Service"]
    sources = {"gradd-token": None, "gradd-tls-cert": "node.crt",
               "gradd-tls-key": "node.key", "gradd-tls-ca": "ca.crt"}
    for value in service["LoadCredential"]:
        name = value.split(":", 1)[0]
        target = creds / name
        if sources[name] is None:
            target.write_text("0123456789abcdef0123456789abcdef\n")
        else:
            target.write_bytes((tmp_path / "certs" / sources[name]).read_bytes())
        target.chmod(0o400)
    args = service["ExecStart"][1].replace("%d", str(creds)).split()
    args[0] = binary
    args[args.index("--config") + 1] = str(REPO / "config" / "gradd.yaml")
    args[args.index("--socket") + 1] = str(tmp_path / "run" / "gradd.sock")
    log = tmp_path / "gradd.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(args + ["--rendezvous-listen", "127.0.0.1:0"],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while "daemon network:" not in log.read_text():
            assert daemon.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        line = [l for l in log.read_text().splitlines()
                if "daemon network:" in l][0]
        assert "mutual TLS" in line and "+ token" in line, line
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0, log.read_text()
