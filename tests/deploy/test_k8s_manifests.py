"""deploy/k8s/*.yaml: every object is valid against the Kubernetes API
models of python3-kubernetes (required fields present, no unknown or
misspelt field anywhere), and the DaemonSet and the example Job have the
properties the node daemon needs. The daemon's config from the ConfigMap is
checked by the real gradd, and the probe command by a real daemon (and a
stopped one) when graddctl is built."""

import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

# scripts/setup installs both: without them this module fails (collection
# error), it does not skip.
try:
    import yaml
    import kubernetes.client as k8s
except ImportError as e:
    raise ImportError(f"{e}: python3-yaml and python3-kubernetes are test "
                      "dependencies (scripts/setup installs them)") from e

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def load_all():
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def model_name(doc):
    """apps/v1 DaemonSet -> V1DaemonSet; batch/v1 Job -> V1Job."""
    version = doc["apiVersion"].split("/")[-1]
    return f"{version.capitalize()}{doc['kind']}"


def unknown_fields(data, type_name, path="$"):
    """Every key of `data` that the model `type_name` does not define."""
    if data is None:
        return []
    m = re.fullmatch(r"list\[(.+)\]", type_name)
    if m:
        assert isinstance(data, list), f"{path}: expected a list"
        return [u for i, v in enumerate(data)
                for u in unknown_fields(v, m.group(1), f"{path}[{i}]")]
    m = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if m:
        assert isinstance(data, dict), f"{path}: expected a map"
        return [u for k, v in data.items()
                for u in unknown_fields(v, m.group(1), f"{path}.{k}")]
    model = getattr(k8s, type_name, None)
    if model is None:  # str, int, bool, object (int-or-string), ...
        return []
    assert isinstance(data, dict), f"{path}: expected an object ({type_name})"
    by_json = {j: a for a, j in model.attribute_map.items()}
    out = []
    for key, value in data.items():
        if key not in by_json:
            out.append(f"{path}.{key} (not a field of {type_name})")
        else:
            out += unknown_fields(value, model.openapi_types[by_json[key]],
                                  f"{path}.{key}")
    return out


def deserialize(doc):
    """The typed model; raises ValueError on a missing required field."""
    client = k8s.ApiClient()
    return client._ApiClient__deserialize(doc, model_name(doc))


def test_manifests_exist():
    names = {p.name for p in MANIFESTS}
    assert {"daemonset.yaml", "training-job.yaml",
            "credentials-secret.yaml"} <= names


@pytest.mark.parametrize("name,doc", load_all(),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_valid_against_the_api_models(name, doc):
    assert hasattr(k8s, model_name(doc)), f"{name}: unknown kind {model_name(doc)}"
    assert unknown_fields(doc, model_name(doc)) == []
    obj = deserialize(doc)
    assert obj.metadata.name


def test_the_checker_rejects_bad_manifests():
    """The validation above can fail: misspelt and missing fields."""
    ds = objects("DaemonSet")[0]
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    assert unknown_fields(bad, "V1DaemonSet") == [
        "$.spec.template.spec.containers[0].livenesProbe "
        "(not a field of V1Container)"]
    del bad["spec"]["selector"]
    with pytest.raises(ValueError, match="selector"):
        deserialize(bad)


def objects(kind):
    return [doc for _, doc in load_all() if doc["kind"] == kind]


@pytest.fixture
def daemonset():
    (ds,) = [deserialize(d) for d in objects("DaemonSet")]
    return ds


@pytest.fixture
def job():
    (j,) = [deserialize(d) for d in objects("Job")]
    return j


def gradd_container(ds):
    (c,) = [c for c in ds.spec.template.spec.containers if c.name == "gradd"]
    return c


def host_run_dir(pod_spec, container):
    """(hostPath, mountPath) of the volume holding the daemon's socket."""
    volumes = {v.name: v for v in pod_spec.volumes}
    for m in container.volume_mounts:
        v = volumes[m.name]
        if v.host_path is not None and v.host_path.path == "/run/gradd":
            return v.host_path, m.mount_path
    raise AssertionError("no hostPath /run/gradd mounted")


def env(container):
    return {e.name: e for e in container.env or []}


def test_daemonset_survives_what_a_node_daemon_must(daemonset):
    spec = daemonset.spec.template.spec
    # A rolling restart would kill every job on the node.
    assert daemonset.spec.update_strategy.type == "OnDelete"
    assert spec.priority_class_name == "system-node-critical"
    # Tolerates every taint (GPU nodes, NoExecute on NotReady nodes).
    assert any(t.operator == "Exists" and t.key is None and t.effect is None
               for t in spec.tolerations)
    c = gradd_container(daemonset)
    assert c.resources.requests["cpu"] and c.resources.requests["memory"]
    assert c.resources.limits["memory"]
    assert c.security_context.run_as_non_root
    assert c.security_context.allow_privilege_escalation is False


def test_daemonset_probes_ask_the_daemon(daemonset):
    c = gradd_container(daemonset)
    for probe in (c.liveness_probe, c.readiness_probe, c.startup_probe):
        assert probe is not None
        cmd = probe._exec.command
        assert Path(cmd[0]).name == "graddctl" and "health" in cmd, cmd
        # A hung daemon fails within timeoutSeconds: graddctl's own bound
        # ends first, so it exits with its code rather than being killed.
        assert probe.timeout_seconds and probe.timeout_seconds <= (
            probe.period_seconds or 10)
        ctl_timeout = cmd[cmd.index("--timeout") + 1]
        assert ctl_timeout.endswith("s") and not ctl_timeout.endswith("ms")
        assert float(ctl_timeout[:-1]) < probe.timeout_seconds
        assert cmd[cmd.index("--socket") + 1] == "/run/gradd/gradd.sock"
    # graddctl finds the daemon's socket through GRADD_SOCKET.
    assert env(c)["GRADD_SOCKET"].value == "/run/gradd/gradd.sock"


def test_daemonset_socket_is_on_the_host(daemonset):
    spec = daemonset.spec.template.spec
    c = gradd_container(daemonset)
    host, mount = host_run_dir(spec, c)
    assert host.type == "DirectoryOrCreate"
    assert "--socket=" + mount + "/gradd.sock" in c.args
    assert env(c)["GRADD_SOCKET"].value.startswith(mount + "/")


def test_daemon_config_is_accepted_by_gradd(tmp_path):
    binary = os.environ.get("GRADD_BINARY", str(REPO / "build/server/gradd"))
    if not os.access(binary, os.X_OK):
        pytest.fail(f"gradd not built at {binary} (ninja -C build gradd)",
                    pytrace=False)
    (cm,) = objects("ConfigMap")
    config = tmp_path / "gradd.yaml"
    config.write_text(cm["data"]["gradd.yaml"])
    r = subprocess.run([binary, "--config", str(config), "--print-config"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "/run/gradd/gradd.sock" in r.stdout


def test_training_job_talks_to_the_node_daemon(job, daemonset):
    spec = job.spec.template.spec
    assert spec.restart_policy in ("Never", "OnFailure")
    (trainer,) = spec.containers
    host, mount = host_run_dir(spec, trainer)
    # The daemon's directory must exist: no empty directory in its place.
    assert host.type == "Directory"
    socket_path = env(trainer)["GRADD_SOCKET"].value
    assert socket_path == mount + "/gradd.sock"
    # Same uid as the daemon (gradd admits only its own uid or root).
    daemon_uid = gradd_container(daemonset).security_context.run_as_user
    uid = (trainer.security_context and trainer.security_context.run_as_user) \
        or spec.security_context.run_as_user
    assert uid == daemon_uid
    # Its own gradd job id per pod.
    assert env(trainer)["GRADD_JOB"].value_from.field_ref.field_path == \
        "metadata.uid"
    # Runs the repository's PyTorch example, as the trainer image has it.
    script = [a for a in trainer.command if a.endswith("train.py")]
    assert script and script[0].endswith("examples/pytorch/train.py")
    assert (REPO / "examples/pytorch/train.py").exists()
    assert trainer.resources.requests["cpu"]


# ---- the probe command against a real daemon ------------------------------

def graddctl_binary():
    found = os.environ.get("GRADDCTL_BINARY")
    if not found:
        build = Path(os.environ.get("GRADD_BUILD_DIR", REPO / "build"))
        hits = [p for p in (build / "tools").rglob("graddctl")
                if p.is_file() and os.access(p, os.X_OK)] \
            if (build / "tools").exists() else []
        found = str(hits[0]) if hits else shutil.which("graddctl")
    if not found:
        pytest.fail("graddctl not built (tools/graddctl, the admin CLI)",
                    pytrace=False)
    return found


def test_probe_passes_for_a_serving_daemon_and_fails_for_a_hung_one(
        daemonset, tmp_path):
    binary = os.environ.get("GRADD_BINARY", str(REPO / "build/server/gradd"))
    if not os.access(binary, os.X_OK):
        pytest.fail(f"gradd not built at {binary} (ninja -C build gradd)",
                    pytrace=False)
    ctl = graddctl_binary()
    probe = gradd_container(daemonset).liveness_probe
    sock = str(tmp_path / "run" / "gradd.sock")
    cmd = [ctl] + [sock if a == "/run/gradd/gradd.sock" else a
                   for a in probe._exec.command[1:]]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(10)
    daemon = subprocess.Popen([binary, "--socket", sock],
                              env=dict(os.environ,
                                       NOTIFY_SOCKET=str(tmp_path / "notify")),
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    probe_env = dict(os.environ, GRADD_SOCKET=sock)
    try:
        assert b"READY=1" in notify.recv(4096)
        r = subprocess.run(cmd, env=probe_env, capture_output=True,
                           timeout=probe.timeout_seconds)
        assert r.returncode == 0, r.stdout + r.stderr
        # Stopped: its sockets stay open, kubelet's probe must fail (non-zero
        # or past timeoutSeconds -- both count as a failure).
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            # graddctl's --timeout ends it inside kubelet's timeoutSeconds.
            r = subprocess.run(cmd, env=probe_env, capture_output=True,
                               timeout=probe.timeout_seconds)
            assert r.returncode != 0, r.stdout + r.stderr
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        r = subprocess.run(cmd, env=probe_env, capture_output=True,
                           timeout=probe.timeout_seconds)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
        notify.close()


# ---- the daemons' credentials (issue 20) -----------------------------------

def credentials_dir(daemonset):
    """(Secret volume, mount path) of the daemon's credentials."""
    spec = daemonset.spec.template.spec
    volumes = {v.name: v for v in spec.volumes}
    for m in gradd_container(daemonset).volume_mounts:
        v = volumes[m.name]
        if v.secret is not None:
            assert m.read_only
            return v.secret, m.mount_path
    raise AssertionError("no Secret mounted into the gradd container")


def test_daemonset_mounts_the_credentials_its_config_names(daemonset):
    secret, mount = credentials_dir(daemonset)
    (template,) = objects("Secret")
    assert secret.secret_name == template["metadata"]["name"]
    # Never optional: no Secret, no daemon (rather than no credentials).
    assert not secret.optional
    # Readable by the daemon's group (fsGroup), by nobody else.
    assert secret.default_mode & 0o007 == 0
    spec = daemonset.spec.template.spec
    assert spec.security_context.fs_group == \
        gradd_container(daemonset).security_context.run_as_group
    (cm,) = objects("ConfigMap")
    rv = yaml.safe_load(cm["data"]["gradd.yaml"])["rendezvous"]
    files = [rv["token_file"], rv["tls"]["cert_file"], rv["tls"]["key_file"],
             rv["tls"]["ca_file"]]
    keys = set(template["stringData"])
    for f in files:
        assert os.path.dirname(f) == mount, f
        assert os.path.basename(f) in keys, f
    # One certificate for every node: the name it carries is checked.
    assert rv["tls"]["server_name"]


def test_an_unfilled_credentials_template_stops_the_daemon(tmp_path):
    """Applying credentials-secret.yaml unchanged must not run the daemons
    with a known secret: gradd refuses its placeholders at start."""
    binary = os.environ.get("GRADD_BINARY", str(REPO / "build/server/gradd"))
    if not os.access(binary, os.X_OK):
        pytest.fail(f"gradd not built at {binary} (ninja -C build gradd)",
                    pytrace=False)
    (template,) = objects("Secret")
    secret_dir = tmp_path / "credentials"
    secret_dir.mkdir()
    for name, value in template["stringData"].items():
        (secret_dir / name).write_text(value)
        (secret_dir / name).chmod(0o440)
    (cm,) = objects("ConfigMap")
    config = tmp_path / "gradd.yaml"
    config.write_text(cm["data"]["gradd.yaml"].replace(
        "/etc/gradd-credentials", str(secret_dir)))
    r = subprocess.run([binary, "--config", str(config), "--socket",
                        str(tmp_path / "run" / "gradd.sock")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "rendezvous.token_file" in r.stderr + r.stdout
    assert "tokens must have 16" in r.stderr + r.stdout
