"""deploy/k8s/etcd/ and deploy/systemd's etcd files (rendezvous.backend:
etcd; docs/operations.md, "Rendezvous on etcd"): the manifests are valid
against the Kubernetes API models of python3-kubernetes and agree with each
other and with the DaemonSet; Debian's etcd (/usr/bin/etcd) run with the
StatefulSet's flags, and with etcd.default's variables, moved to loopback
and a temporary directory, serves a real gradd on the matching config
(gradd-config-etcd.yaml, gradd-etcd.yaml with gradd-etcd.conf's
credentials) over mutual TLS, and `graddctl status` shows the backend and
the daemon's lease held, never a line of a key. Each test skips with its
reason when its tool is missing."""

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from test_systemd_unit import parse_unit

# scripts/setup installs it: without it this module fails, it does not skip.
try:
    import yaml
except ImportError as e:
    raise ImportError(f"{e}: python3-yaml is a test dependency (scripts/setup "
                      "installs it)") from e

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
ETCD_K8S = K8S / "etcd"
SYSTEMD = REPO / "deploy" / "systemd"
ETCD = os.environ.get("GRADD_TEST_ETCD_BINARY", "/usr/bin/etcd")
CREDENTIALS_DIR = "/run/credentials/gradd.service/"


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def etcd_docs():
    return [(p.name, d) for p in sorted(ETCD_K8S.glob("*.yaml")) for d in docs(p)]


def one(kind, name=None, path=None):
    found = [d for _, d in etcd_docs()] if path is None else docs(path)
    found = [d for d in found
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def flags(args):
    """--key=value arguments as a dict."""
    out = {}
    for a in args:
        assert a.startswith("--") and "=" in a, a
        key, _, value = a[2:].partition("=")
        assert key not in out, f"--{key} twice"
        out[key] = value
    return out


def etcd_container():
    sts = one("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return sts, c


def gradd_config(text):
    return yaml.safe_load(text)


# ---- the manifests -----------------------------------------------------------

@pytest.fixture(scope="module")
def models():
    """test_k8s_manifests' checker (python3-kubernetes' models)."""
    import test_k8s_manifests  # fails without python3-kubernetes
    return test_k8s_manifests


def test_the_etcd_files_exist():
    names = {p.name for p in ETCD_K8S.glob("*.yaml")}
    assert {"etcd-statefulset.yaml", "etcd-secrets.yaml",
            "gradd-config-etcd.yaml"} <= names
    assert {"gradd-etcd.conf", "gradd-etcd.yaml", "etcd.default"} <= {
        p.name for p in SYSTEMD.iterdir()}


@pytest.mark.parametrize("name,doc", etcd_docs(),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_valid_against_the_api_models(models, name, doc):
    assert models.unknown_fields(doc, models.model_name(doc)) == []
    assert models.deserialize(doc).metadata.name
    assert doc["metadata"]["namespace"] == "gradd"


def test_the_statefulset_forms_one_cluster_of_its_replicas():
    sts, c = etcd_container()
    spec = sts["spec"]
    replicas = spec["replicas"]
    assert replicas >= 3 and replicas % 2 == 1
    # Every member starts at once: a new cluster needs a quorum of them.
    assert spec["podManagementPolicy"] == "Parallel"
    service = one("Service", spec["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    name, ns, svc = sts["metadata"]["name"], sts["metadata"]["namespace"], \
        spec["serviceName"]
    host = f"$(POD_NAME).{svc}.{ns}.svc.cluster.local"
    f = flags(c["args"])
    assert f["name"] == "$(POD_NAME)"
    (env,) = [e for e in c["env"] if e["name"] == "POD_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    members = dict(m.split("=", 1) for m in f["initial-cluster"].split(","))
    assert members == {
        f"{name}-{i}": f"https://{name}-{i}.{svc}.{ns}.svc.cluster.local:2380"
        for i in range(replicas)}
    assert f["initial-advertise-peer-urls"] == f"https://{host}:2380"
    assert f["advertise-client-urls"] == f"https://{host}:2379"
    assert f["initial-cluster-state"] == "new"
    # TLS both ways, and a certificate of the CA demanded of both sides.
    assert f["listen-client-urls"].startswith("https://")
    assert f["listen-peer-urls"].startswith("https://")
    assert f["client-cert-auth"] == "true" and f["peer-client-cert-auth"] == "true"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f["listen-client-urls"].endswith(f":{ports['client']}")
    assert f["listen-peer-urls"].endswith(f":{ports['peer']}")
    assert f["listen-metrics-urls"].endswith(f":{ports['metrics']}")
    # Liveness must not restart the members that remain when the quorum is
    # lost: it asks this member only.
    for probe in ("livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/health?serializable=true"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # One member per node, and drains leave a quorum.
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == replicas // 2 + 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Data survives a restart.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    (claim,) = spec["volumeClaimTemplates"]
    assert f["data-dir"].startswith(mounts[claim["metadata"]["name"]] + "/")


def test_the_statefulsets_tls_files_come_from_its_secret():
    sts, c = etcd_container()
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in c["volumeMounts"]
                if "secret" in volumes.get(m["name"], {})]
    secret = volumes[mount["name"]]["secret"]
    assert not secret.get("optional", False)
    assert secret["defaultMode"] & 0o007 == 0
    keys = set(one("Secret", secret["secretName"])["stringData"])
    files = {k: v for k, v in flags(c["args"]).items() if k.endswith("-file")}
    assert len(files) == 6
    for key, path in files.items():
        assert os.path.dirname(path) == mount["mountPath"], key
        assert os.path.basename(path) in keys, key


def test_the_gradd_config_names_every_member_and_the_mounted_client_secret():
    sts, c = etcd_container()
    name, ns, svc = sts["metadata"]["name"], sts["metadata"]["namespace"], \
        sts["spec"]["serviceName"]
    cm = one("ConfigMap", "gradd-config")
    config = gradd_config(cm["data"]["gradd.yaml"])
    rv = config["rendezvous"]
    assert rv["backend"] == "etcd"
    assert rv["etcd"]["endpoints"].split(",") == [
        f"{name}-{i}.{svc}.{ns}.svc.cluster.local:2379"
        for i in range(sts["spec"]["replicas"])]
    # The DaemonSet mounts the client Secret where the config reads it.
    ds = one("DaemonSet", path=K8S / "daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    (gradd,) = [x for x in pod["containers"] if x["name"] == "gradd"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    client = one("Secret", "gradd-etcd-client")
    (mount,) = [m for m in gradd["volumeMounts"]
                if volumes[m["name"]].get("secret", {}).get("secretName") ==
                client["metadata"]["name"]]
    assert mount["readOnly"]
    # Optional: the built-in store's daemons have no such Secret.
    assert volumes[mount["name"]]["secret"]["optional"] is True
    for key in ("ca_file", "cert_file", "key_file"):
        path = rv["etcd"][key]
        assert os.path.dirname(path) == mount["mountPath"], key
        assert os.path.basename(path) in client["stringData"], key
    # It replaces the DaemonSet's ConfigMap (same name) and changes only
    # the backend: the daemons' own credentials stay.
    base = one("ConfigMap", "gradd-config", path=K8S / "daemonset.yaml")
    assert cm["metadata"] == base["metadata"]
    base_config = gradd_config(base["data"]["gradd.yaml"])
    del rv["backend"], rv["etcd"]
    assert config == base_config


def test_the_secret_templates_hold_no_key():
    for secret in (one("Secret", "etcd-tls"), one("Secret", "gradd-etcd-client")):
        for key, value in secret["stringData"].items():
            assert "BEGIN" not in value and value.startswith("REPLACE ME"), key


# ---- systemd -----------------------------------------------------------------

def loaded_credentials():
    service = parse_unit((SYSTEMD / "gradd-etcd.conf").read_text())["Service"]
    return dict(v.split(":", 1) for v in service["LoadCredential"])


def test_the_dropin_loads_what_the_config_names():
    unit = parse_unit((SYSTEMD / "gradd-etcd.conf").read_text())
    # It adds to the unit and to gradd-multinode.conf, replaces nothing.
    assert "ExecStart" not in unit["Service"]
    assert unit["Unit"]["After"] == ["etcd.service"]
    loaded = loaded_credentials()
    assert all(p.startswith("/etc/gradd/etcd/") for p in loaded.values())
    etcd = gradd_config((SYSTEMD / "gradd-etcd.yaml").read_text())[
        "rendezvous"]["etcd"]
    named = {etcd[k] for k in ("ca_file", "cert_file", "key_file")}
    assert named == {CREDENTIALS_DIR + n for n in loaded}


def test_verify_passes_with_both_dropins(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not installed (Debian: systemd, which "
                    "scripts/setup installs)", pytrace=False)
    binary = gradd_binary()
    unit = tmp_path / "gradd.service"
    unit.write_text((SYSTEMD / "gradd.service").read_text().replace(
        "/usr/local/bin/gradd ", binary + " "))
    dropins = tmp_path / "gradd.service.d"
    dropins.mkdir()
    (dropins / "multinode.conf").write_text(
        (SYSTEMD / "gradd-multinode.conf").read_text().replace(
            "/usr/local/bin/gradd ", binary + " "))
    (dropins / "etcd.conf").write_text((SYSTEMD / "gradd-etcd.conf").read_text())
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    complaints = [l for l in r.stderr.splitlines()
                  if "gradd.service" in l or ".conf" in l]
    assert complaints == [], r.stderr


def etcd_default():
    out = {}
    for line in (SYSTEMD / "etcd.default").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_etcd_default_is_one_member_of_a_tls_cluster():
    env = etcd_default()
    members = dict(m.split("=", 1) for m in env["ETCD_INITIAL_CLUSTER"].split(","))
    assert len(members) % 2 == 1 and len(members) >= 3
    assert members[env["ETCD_NAME"]] == env["ETCD_INITIAL_ADVERTISE_PEER_URLS"]
    assert env["ETCD_CLIENT_CERT_AUTH"] == env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    for key in ("ETCD_LISTEN_PEER_URLS", "ETCD_LISTEN_CLIENT_URLS",
                "ETCD_ADVERTISE_CLIENT_URLS"):
        assert all(u.startswith("https://") for u in env[key].split(",")), key
    # gradd's config names every member's client URL.
    endpoints = gradd_config((SYSTEMD / "gradd-etcd.yaml").read_text())[
        "rendezvous"]["etcd"]["endpoints"].split(",")
    assert [u.removeprefix("https://").replace(":2380", ":2379")
            for u in members.values()] == endpoints


# ---- etcd and gradd, for real ------------------------------------------------

def gradd_binary():
    binary = os.environ.get("GRADD_BINARY", str(REPO / "build/server/gradd"))
    if not os.access(binary, os.X_OK):
        pytest.fail(f"gradd not built at {binary} (ninja -C build gradd)",
                    pytrace=False)
    return os.path.abspath(binary)


def graddctl_binary():
    build = Path(os.environ.get("GRADD_BUILD_DIR", REPO / "build"))
    found = os.environ.get("GRADDCTL_BINARY") or next(
        (str(p) for p in (build / "tools").rglob("graddctl")
         if p.is_file() and os.access(p, os.X_OK)), None) \
        if (build / "tools").exists() else shutil.which("graddctl")
    if not found:
        pytest.fail("graddctl not built (tools/graddctl, the admin CLI)",
                    pytrace=False)
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def certs(tmp_path):
    if not os.access(ETCD, os.X_OK):
        pytest.fail(f"etcd not installed at {ETCD} (scripts/setup installs "
                    "etcd-server)", pytrace=False)
    out = tmp_path / "certs"
    subprocess.run(["sh", str(REPO / "tests/tools/make_test_certs.sh"), str(out)],
                   check=True, timeout=60)
    return out


class Etcd:
    """/usr/bin/etcd with `args` and `env` on loopback; stopped by stop()."""

    def __init__(self, tmp_path, args, env, metrics_port):
        self.log = tmp_path / "etcd.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([ETCD, *args], env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                url = f"http://127.0.0.1:{metrics_port}/health"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if b'"true"' in r.read():
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.2)
        # What the probes of the StatefulSet ask answers too.
        with urllib.request.urlopen(url + "?serializable=true", timeout=5) as r:
            assert r.status == 200

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_gradd_on(tmp_path, config_text, extra_args, certs):
    """A gradd on `config_text` (socket and metrics moved into tmp_path):
    `graddctl status` once it serves, then SIGTERM and exit 0. Returns the
    status output and the daemon's log."""
    sock = tmp_path / "run" / "gradd.sock"
    config = gradd_config(config_text)
    config["socket_path"] = str(sock)
    config["metrics"] = {"listen_address": "127.0.0.1:0"}
    path = tmp_path / "gradd.yaml"
    path.write_text(yaml.safe_dump(config))
    ctl = graddctl_binary()
    log = tmp_path / "gradd.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen([gradd_binary(), "--config", str(path),
                                   *extra_args], stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([ctl, "--socket", str(sock), "--timeout", "2s",
                              "health"], capture_output=True).returncode != 0:
            assert daemon.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        outputs = [subprocess.run([ctl, "--socket", str(sock), *args],
                                  capture_output=True, text=True, timeout=30)
                   for args in (["status"], ["--json", "status"], ["config"])]
        for r in outputs:
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()
    text = log.read_text()
    key_line = (certs / "node.key").read_text().splitlines()[1]
    for shown in [r.stdout for r in outputs] + [text]:
        assert key_line not in shown and "PRIVATE KEY" not in shown
    return outputs[0].stdout, text


def token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    token.chmod(0o600)
    return token


def test_the_statefulsets_etcd_serves_the_configmaps_gradd(tmp_path, certs):
    """etcd-0 as the StatefulSet runs it, alone, on loopback: its flags with
    the names, ports and files moved; gradd with the ConfigMap's config,
    the Secrets' files replaced by the test CA's."""
    _, c = etcd_container()
    client, peer, metrics = free_port(), free_port(), free_port()
    name = "etcd-0"
    host = f"{name}.etcd.gradd.svc.cluster.local"
    files = {"ca.crt": "ca.crt", "server.crt": "node.crt", "server.key": "node.key",
             "peer.crt": "node.crt", "peer.key": "node.key"}
    args = []
    for a in c["args"]:
        a = a.replace("$(POD_NAME)", name)
        a = a.replace(f"{host}:2379", f"127.0.0.1:{client}")
        a = a.replace(f"{host}:2380", f"127.0.0.1:{peer}")
        a = a.replace("0.0.0.0:2379", f"127.0.0.1:{client}")
        a = a.replace("0.0.0.0:2380", f"127.0.0.1:{peer}")
        a = a.replace("0.0.0.0:2381", f"127.0.0.1:{metrics}")
        if a.startswith("--initial-cluster="):
            a = f"--initial-cluster={name}=https://127.0.0.1:{peer}"
        if a.startswith("--data-dir="):
            a = f"--data-dir={tmp_path / 'etcd-data'}"
        for secret_key, test_file in files.items():
            a = a.replace(f"/etc/etcd/tls/{secret_key}", str(certs / test_file))
        args.append(a)
    assert not any("/etc/etcd" in a or "svc.cluster.local" in a for a in args), args
    etcd = Etcd(tmp_path, args, {"PATH": os.environ.get("PATH", "/usr/bin")},
                metrics)
    try:
        config = one("ConfigMap", "gradd-config")["data"]["gradd.yaml"]
        config = re.sub(r'endpoints: ".*"', f'endpoints: "127.0.0.1:{client}"', config)
        for mounted, test_file in {
                "/etc/gradd-etcd/ca.crt": "ca.crt",
                "/etc/gradd-etcd/client.crt": "node.crt",
                "/etc/gradd-etcd/client.key": "node.key",
                "/etc/gradd-credentials/tls.crt": "node.crt",
                "/etc/gradd-credentials/tls.key": "node.key",
                "/etc/gradd-credentials/ca.crt": "ca.crt"}.items():
            config = config.replace(mounted, str(certs / test_file))
        config = config.replace("/etc/gradd-credentials/token",
                                str(token_file(tmp_path)))
        status, log = run_gradd_on(tmp_path, config, [], certs)
    finally:
        etcd.stop()
    assert f"rendezvous      etcd at 127.0.0.1:{client} (mTLS, prefix /gradd/)\n" \
        in status, status
    assert re.search(r"etcd lease +[0-9a-f]+ held, ttl ", status), status
    assert f"rendezvous backend etcd at 127.0.0.1:{client} (mTLS, prefix " \
        "/gradd/, lease " in log, log


def test_etcd_default_serves_the_systemd_config(tmp_path, certs):
    """Debian's etcd with etcd.default's variables (as its etcd.service
    passes them), moved to loopback; gradd with gradd-etcd.yaml and the
    credentials gradd-etcd.conf loads, in a directory as systemd fills it,
    plus gradd-multinode.conf's token."""
    client, peer, metrics = free_port(), free_port(), free_port()
    env = etcd_default()
    files = {"etcd-ca.crt": "ca.crt", "server.crt": "node.crt",
             "server.key": "node.key", "peer.crt": "node.crt", "peer.key": "node.key"}
    for key, value in env.items():
        value = value.replace("10.0.0.1:2380", f"127.0.0.1:{peer}")
        value = value.replace("127.0.0.1:2381", f"127.0.0.1:{metrics}")
        for secret_key, test_file in files.items():
            value = value.replace(f"/etc/etcd/tls/{secret_key}", str(certs / test_file))
        env[key] = value
    env["ETCD_LISTEN_CLIENT_URLS"] = f"https://127.0.0.1:{client}"
    env["ETCD_ADVERTISE_CLIENT_URLS"] = f"https://127.0.0.1:{client}"
    env["ETCD_INITIAL_CLUSTER"] = f"{env['ETCD_NAME']}=https://127.0.0.1:{peer}"
    env["ETCD_DATA_DIR"] = str(tmp_path / "etcd-data")
    assert not any("10.0.0." in v or "/etc/etcd" in v for v in env.values()), env
    env["PATH"] = os.environ.get("PATH", "/usr/bin")
    etcd = Etcd(tmp_path, [], env, metrics)
    try:
        creds = tmp_path / "credentials"
        creds.mkdir()
        sources = {"etcd-ca.crt": "ca.crt", "gradd-etcd.crt": "node.crt",
                   "gradd-etcd.key": "node.key"}
        for name, path in loaded_credentials().items():
            (creds / name).write_bytes((certs / sources[os.path.basename(path)])
                                       .read_bytes())
            (creds / name).chmod(0o400)
        config = (SYSTEMD / "gradd-etcd.yaml").read_text()
        config = re.sub(r'endpoints: ".*"', f'endpoints: "127.0.0.1:{client}"', config)
        config = config.replace(CREDENTIALS_DIR, str(creds) + "/")
        status, log = run_gradd_on(
            tmp_path, config,
            [f"--rendezvous-token-file={token_file(tmp_path)}"], certs)
    finally:
        etcd.stop()
    # Every variable is one etcd knows.
    assert "unrecognized environment variable" not in etcd.log.read_text(), \
        etcd.log.read_text()
    assert f"rendezvous      etcd at 127.0.0.1:{client} (mTLS, prefix /gradd/)\n" \
        in status, status
    assert re.search(r"etcd lease +[0-9a-f]+ held, ttl ", status), status
