"""`gradd run` (issue 33) with real processes: the launcher, the daemon it
starts or finds, its workers (tests/python/run_worker.py: torch's DDP
tutorial loop with gradd.torch's DDP and `ddp.steps(optimizer, n)`), restarts,
failures, signals, and two nodes in network namespaces."""
import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import HERE

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "run_worker.py")
NETBENCH = os.path.join(REPO, "scripts", "netbench")


@pytest.fixture
def run_env(gradd_binary, tmp_path):
    """The launcher's environment: no daemon at the node's socket (a path
    in the test's directory; as root the default would be /run/gradd)."""
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRADD_TEST_", "TORCHELASTIC_")) and k not in (
               "GRADD_JOB", "GRADD_RANK_RESTART_GRACE_MS", "RANK", "WORLD_SIZE",
               "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(GRADD_BINARY=gradd_binary, GRADD_SOCKET=str(tmp_path / "none" / "gradd.sock"),
               GRADD_TEST_OUT=str(out), OMP_NUM_THREADS="1")
    return env


def launch(env, *args, timeout=180, **extra):
    """Runs `python3 -m gradd.run ARGS` to its end; returns (rc, stdout, stderr)."""
    e = dict(env, **{k: str(v) for k, v in extra.items()})
    p = subprocess.run([sys.executable, "-m", "gradd.run", *map(str, args)], env=e,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def reports(env):
    out = env["GRADD_TEST_OUT"]
    return {r["rank"]: r for r in (json.load(open(p)) for p in
                                   glob.glob(os.path.join(out, "rank*.json")))}


def pid_files(env):
    """{(rank, restart): {"pid", "socket"}} of every worker start."""
    got = {}
    for p in glob.glob(os.path.join(env["GRADD_TEST_OUT"], "pid-*")):
        _, rank, restart = os.path.basename(p).split("-")
        with open(p) as f:
            got[(int(rank), int(restart))] = json.load(f)
    return got


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def daemons_on(socket_path):
    """Pids of processes whose command line names `socket_path`."""
    pids = []
    for d in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(d, "rb") as f:
                if socket_path.encode() in f.read():
                    pids.append(int(d.split("/")[2]))
        except OSError:
            pass
    return [p for p in pids if alive(p)]


def check_stopped(env):
    """No worker of the launch is left, nor the daemon it started."""
    for (rank, restart), info in pid_files(env).items():
        assert not alive(info["pid"]), f"rank {rank} (start {restart}) still runs"


# ---------------------------------------------------------------- launching
def test_fresh_launch_starts_its_own_daemon_and_stops_it(run_env):
    rc, out, err = launch(run_env, "--nproc-per-node", 2, WORKER, GRADD_TEST_STEPS=3)
    assert rc == 0, out + err
    res = reports(run_env)
    assert sorted(res) == [0, 1]
    sock = res[0]["env"]["GRADD_SOCKET"]
    # A daemon in a private directory, not at the node's (empty) socket path.
    assert sock != run_env["GRADD_SOCKET"] and os.path.basename(
        os.path.dirname(sock)).startswith("gradd-run-")
    assert "daemon started for this launch" in err
    # Gone at the end, with its directory.
    assert not os.path.exists(os.path.dirname(sock))
    assert daemons_on(sock) == []
    # torchrun's environment.
    for r in (0, 1):
        e = res[r]["env"]
        assert e["RANK"] == e["LOCAL_RANK"] == e["ROLE_RANK"] == str(r)
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"],
                e["ROLE_WORLD_SIZE"], e["ROLE_NAME"]) == ("2", "2", "0", "1", "2", "default")
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "29500"
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"],
                e["TORCHELASTIC_RUN_ID"]) == ("0", "0", "none")
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert e["TORCHELASTIC_ERROR_FILE"]
        assert e["GRADD_RANK_RESTART_GRACE_MS"] is None  # no restarts asked for
        assert res[r]["step_count"] == 3 and res[r]["skipped"] == 0
        assert res[r]["job_id"] == e["GRADD_JOB"] == res[0]["env"]["GRADD_JOB"]
        # Every line of the worker carries its rank, as torchrun's --tee.
        assert f"[rank{r}]:rank {r} starting (restart 0)\n" in out
        assert f"[rank{r}]:rank {r} done: 3 steps, 0 skipped\n" in out
    assert res[0]["params_hex"] == res[1]["params_hex"]
    # A fresh job id for each launch.
    first = res[0]["job_id"]
    for p in glob.glob(os.path.join(run_env["GRADD_TEST_OUT"], "*")):
        os.unlink(p)
    rc, out, err = launch(run_env, "--standalone", "--nproc_per_node", 1, WORKER,
                          GRADD_TEST_STEPS=1)
    assert rc == 0, out + err
    again = reports(run_env)[0]
    assert again["job_id"].startswith("run-") and again["job_id"] != first
    assert again["env"]["MASTER_PORT"] != "29500"  # --standalone: a free port


def test_launch_uses_the_running_daemon(run_env, daemon):
    rc, out, err = launch(run_env, "--nproc-per-node", 2, WORKER, GRADD_TEST_STEPS=2,
                          GRADD_SOCKET=daemon.socket)
    assert rc == 0, out + err
    res = reports(run_env)
    assert {res[r]["env"]["GRADD_SOCKET"] for r in (0, 1)} == {daemon.socket}
    assert f"daemon at {daemon.socket}" in err
    assert "started for this launch" not in err
    assert daemon.proc.poll() is None  # not stopped by the launcher
    assert f"'{res[0]['job_id']}'" in daemon.log()  # the job ran there


# ------------------------------------------------------------------ restarts
def test_sigkilled_worker_is_restarted_alone_and_training_ends_as_uninterrupted(run_env):
    steps, victim, die_at = 10, 1, 4
    rc, out, err = launch(run_env, "--nproc-per-node", 2, "--max-restarts", 1, WORKER,
                          GRADD_TEST_STEPS=steps, GRADD_TEST_VICTIM=victim,
                          GRADD_TEST_DIE_AT_STEP=die_at)
    assert rc == 0, out + err
    assert (f"rank {victim} (local rank {victim}) was killed by SIGKILL; restarting it "
            "alone (restart 1 of 1)") in err
    starts = pid_files(run_env)
    # The survivor was never restarted: one process from start to end.
    assert sorted(starts) == [(0, 0), (1, 0), (1, 1)]
    res = reports(run_env)
    assert res[0]["pid"] == starts[(0, 0)]["pid"] and res[0]["restart_count"] == 0
    assert res[1]["pid"] == starts[(1, 1)]["pid"] and res[1]["restart_count"] == 1
    # It paused: the iteration the restart aborted was skipped, then retried.
    assert res[0]["skipped"] == 1 and res[0]["rejoined"] is False
    assert res[1]["rejoined"] is True and res[1]["skipped"] == 0
    assert res[0]["env"]["GRADD_RANK_RESTART_GRACE_MS"] == "60000"
    assert res[1]["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert res[0]["step_count"] == res[1]["step_count"] == steps
    assert res[0]["params_hex"] == res[1]["params_hex"]
    # The same training without the kill: bitwise the same parameters.
    killed = res[0]["params_hex"]
    for p in glob.glob(os.path.join(run_env["GRADD_TEST_OUT"], "*")):
        os.unlink(p)
    rc, out, err = launch(run_env, "--nproc-per-node", 2, WORKER, GRADD_TEST_STEPS=steps)
    assert rc == 0, out + err
    assert reports(run_env)[0]["params_hex"] == killed


def test_max_restarts_used_up_ends_the_launch(run_env):
    t0 = time.monotonic()
    rc, out, err = launch(run_env, "--nproc-per-node", 2, "--max-restarts", 1, WORKER,
                          GRADD_TEST_STEPS=10, GRADD_TEST_VICTIM=1, GRADD_TEST_DIE_AT_STEP=2,
                          GRADD_TEST_DIE_ALWAYS=1)
    assert rc == 1, out + err
    assert "restarting it alone (restart 1 of 1)" in err
    assert "rank 1 (local rank 1) failed with exit code -9" in err
    assert "no restarts left (--max-restarts 1)" in err
    assert "run_worker.py FAILED" in err and "Root Cause" in err
    assert sorted(pid_files(run_env)) == [(0, 0), (1, 0), (1, 1)]
    assert reports(run_env) == {}  # nobody finished
    check_stopped(run_env)
    # The survivor, paused in gradd, was stopped, not waited for (grace 60 s).
    assert time.monotonic() - t0 < 50


def test_exception_in_a_worker_ends_the_launch_with_its_traceback(run_env):
    rc, out, err = launch(run_env, "--nproc-per-node", 2, "--max-restarts", 3, WORKER,
                          GRADD_TEST_STEPS=10, GRADD_TEST_VICTIM=1,
                          GRADD_TEST_RAISE_AT_STEP=2)
    assert rc == 1, out + err
    # The worker's own traceback, prefixed, and again in torchrun's summary.
    assert "[rank1]:ValueError: rank 1 fails on purpose at step 2" in err
    summary = err[err.index("run_worker.py FAILED"):]
    assert "rank      : 1 (local_rank: 1)" in summary
    assert "exitcode  : 1" in summary
    assert "Traceback (most recent call last)" in summary
    assert "ValueError: rank 1 fails on purpose at step 2" in summary
    assert "restarting" not in err  # an error is not restarted
    assert sorted(pid_files(run_env)) == [(0, 0), (1, 0)]
    check_stopped(run_env)


# ------------------------------------------------------------------- signals
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_worker_and_the_daemon(run_env, sig):
    e = dict(run_env, GRADD_TEST_STEPS="100000", GRADD_TEST_STEP_SLEEP="0.05")
    p = subprocess.Popen([sys.executable, "-m", "gradd.run", "--nproc-per-node", "2",
                          "--max-restarts", "2", WORKER], env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(pid_files(run_env)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pid_files(run_env)) == 2, "workers did not start"
        time.sleep(1.0)  # training
        sock = pid_files(run_env)[(0, 0)]["socket"]
        assert daemons_on(sock)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1, err  # torchrun's status after a signal
    assert f"received {signal.Signals(sig).name}; stopping the workers" in err
    assert "restarting" not in err  # workers stopped by the launcher stay stopped
    assert sorted(pid_files(run_env)) == [(0, 0), (1, 0)]
    check_stopped(run_env)
    assert daemons_on(sock) == []
    assert not os.path.exists(os.path.dirname(sock))


# ---------------------------------------------------------------- bad flags
@pytest.mark.parametrize("args,message", [
    (["--nproc-per-node", "two", "x.py"], "argument --nproc-per-node: invalid value 'two'"),
    (["--nnodes", "2", "x.py"], "argument --node-rank: required with --nnodes 2"),
    (["--nnodes", "3:2", "--node-rank", "0", "x.py"], "argument --nnodes: invalid value '3:2'"),
    (["--max-restarts", "-1", "x.py"], "argument --max-restarts: -1 is negative"),
    (["--tee", "5", "x.py"], "argument --tee: 5 is not one of 0, 1, 2, 3"),
    (["--rdzv-backend", "etcd", "x.py"], "argument --rdzv-backend: 'etcd' is not supported"),
    (["--bogus", "x.py"], "unrecognized arguments: --bogus"),
    ([], "the following arguments are required: training_script"),
])
def test_bad_flags_get_torchrun_style_errors(run_env, args, message):
    rc, out, err = launch(run_env, *args, timeout=60)
    assert rc == 2
    assert err.startswith("usage: gradd run"), err
    assert f"gradd run: error: {message}" in err, err


def test_redirects_and_tee_write_log_files(run_env, tmp_path):
    logs = tmp_path / "logs"
    rc, out, err = launch(run_env, "--nproc-per-node", 2, "--log-dir", logs,
                          "--redirects", 3, "--tee", "0:1", WORKER, GRADD_TEST_STEPS=1)
    assert rc == 0, out + err
    job = reports(run_env)[0]["job_id"]
    for r in (0, 1):
        with open(logs / job / "attempt_0" / str(r) / "stdout.log") as f:
            assert f"rank {r} done: 1 steps, 0 skipped" in f.read()
    # Rank 0's stdout is tee'd to the console too; rank 1's only redirected.
    assert "[rank0]:rank 0 done" in out
    assert "[rank1]:" not in out


# ---------------------------------------------------------- two nodes (netns)
def _netns_reason():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.fail("iproute2 (ip, tc) is not installed (scripts/setup installs it)",
                    pytrace=False)
    name = f"gnbprobe{secrets.token_hex(2)}"
    p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return None


def _namespaces(run_id):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith(f"gnb{run_id}")]


@contextlib.contextmanager
def _two_netns_nodes(env, tmp_path):
    """scripts/netbench's cluster of 2 network namespaces (198.18.0.1 and .2
    on a bridge), held for the test, and a token file for the daemons.
    Yields (namespaces, token, procs): procs is a dict the test fills with
    its launchers' Popen objects. On exit every launcher still running gets
    SIGTERM (then SIGKILL), the cluster is taken down, and every namespace
    made must be gone."""
    run_id = secrets.token_hex(3)
    cluster = subprocess.Popen(
        [sys.executable, NETBENCH, "--setup-only", "--nodes", "2", "--run-id", run_id,
         "--rate", "1gbit"], env=dict(env, NETBENCH_HOLD="600"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(24) + "\n")
    token.chmod(0o600)
    procs = {}
    try:
        info = json.loads(cluster.stdout.readline())
        assert cluster.stdout.readline().strip() == "HOLDING"
        assert info["addresses"] == ["198.18.0.1", "198.18.0.2"]
        yield info["namespaces"], token, procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        cluster.send_signal(signal.SIGINT)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            cluster.kill()
            cluster.wait()
        subprocess.run([sys.executable, NETBENCH, "--cleanup", "--run-id", run_id],
                       capture_output=True, env=env)
    assert _namespaces(run_id) == []  # every namespace made is gone


def test_two_nodes_in_network_namespaces_restart_one_nodes_worker(run_env, tmp_path):
    """scripts/netbench's cluster (198.18.0.1 and .2 on a bridge), one
    `gradd run --nnodes 2` in each namespace, each starting its own daemon;
    node 1's worker is SIGKILLed and restarted by its launcher."""
    reason = _netns_reason()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in run_env.items() if k != "LD_PRELOAD"}
    with _two_netns_nodes(env, tmp_path) as (namespaces, token, procs):
        for k, ns in enumerate(namespaces):
            procs[k] = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "gradd.run",
                 "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1",
                 "--master-addr", "198.18.0.1", "--master-port", "29500",
                 "--max-restarts", "1", "--gradd-token-file", str(token), WORKER],
                env=dict(env, GRADD_TEST_STEPS="10", GRADD_TEST_VICTIM="1",
                         GRADD_TEST_DIE_AT_STEP="4"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = []
        for k in (0, 1):
            out, err = procs[k].communicate(timeout=240)
            results.append((procs[k].returncode, out, err))
        report = "\n".join(f"--- node {k}: exit {rc}\n{out}\n{err}"
                           for k, (rc, out, err) in enumerate(results))
        assert all(rc == 0 for rc, _, _ in results), report
    assert "rank 1 (local rank 0) was killed by SIGKILL; restarting it alone" in results[1][2]
    assert "restarting" not in results[0][2]
    starts = pid_files(run_env)
    assert sorted(starts) == [(0, 0), (1, 0), (1, 1)]
    res = reports(run_env)
    assert res[0]["job_id"] == res[1]["job_id"]  # one job id, drawn by node rank 0
    assert res[0]["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert res[1]["env"]["GROUP_RANK"] == "1" and res[1]["env"]["WORLD_SIZE"] == "2"
    assert res[0]["env"]["GRADD_SOCKET"] != res[1]["env"]["GRADD_SOCKET"]  # a daemon each
    assert res[0]["pid"] == starts[(0, 0)]["pid"] and res[0]["skipped"] >= 1
    assert res[1]["rejoined"] is True and res[1]["restart_count"] == 1
    assert res[0]["step_count"] == res[1]["step_count"] == 10
    assert res[0]["params_hex"] == res[1]["params_hex"]
    for (rank, restart), s in starts.items():
        assert not alive(s["pid"])
        assert daemons_on(s["socket"]) == []


def test_two_nodes_a_node_lost_and_back_under_gradd_run(run_env, tmp_path):
    """Node loss and arrival as without the launcher: `--nnodes 1:2` forms a
    2-node job with min_nodes 1 (GRADD_MIN_NODES); node 1 dies whole (its
    launcher, worker and daemon SIGKILLed), node 0's worker goes on alone,
    then node 1's launcher is started again with the same command: its new
    daemon and worker are admitted into the running job (same job id, drawn
    by node rank 0), take the job's state and step, and both ranks end with
    the same parameters after the same number of steps."""
    reason = _netns_reason()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in run_env.items() if k != "LD_PRELOAD"}
    env.update(GRADD_TEST_STEPS="80", GRADD_TEST_STEP_SLEEP="0.1")
    with _two_netns_nodes(env, tmp_path) as (namespaces, token, procs):
        def start(k):
            procs[k] = subprocess.Popen(
                ["ip", "netns", "exec", namespaces[k], sys.executable, "-m", "gradd.run",
                 "--nnodes", "1:2", "--node-rank", str(k), "--nproc-per-node", "1",
                 "--master-addr", "198.18.0.1", "--master-port", "29500",
                 "--gradd-token-file", str(token), WORKER],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        start(0)
        start(1)
        deadline = time.monotonic() + 120
        while (1, 0) not in pid_files(run_env) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (1, 0) in pid_files(run_env), "node 1's worker never started"
        time.sleep(2.0)  # some steps on two nodes
        # Node 1 dies whole: its launcher, its worker, its daemon.
        victim = pid_files(run_env)[(1, 0)]
        procs[1].kill()
        first_err = procs[1].communicate(timeout=30)[1]
        for pid in [victim["pid"]] + daemons_on(victim["socket"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(2.0)  # node 0 goes on alone
        assert procs[0].poll() is None, procs[0].communicate()
        os.unlink(os.path.join(run_env["GRADD_TEST_OUT"], "pid-1-0"))
        start(1)
        results = {}
        for k in (0, 1):
            out, err = procs[k].communicate(timeout=240)
            results[k] = (procs[k].returncode, out, err)
        report = "\n".join(f"--- node {k}: exit {rc}\n{out}\n{err}"
                           for k, (rc, out, err) in results.items())
        assert all(rc == 0 for rc, _, _ in results.values()), report + first_err
    res = reports(run_env)
    assert sorted(res) == [0, 1], report
    assert res[0]["env"]["GRADD_MIN_NODES"] == res[1]["env"]["GRADD_MIN_NODES"] == "1"
    assert res[0]["job_id"] == res[1]["job_id"], report
    assert res[1]["rejoined"] is True, report  # admitted into the running job
    assert res[0]["skipped"] >= 2, report  # the loss and the arrival
    assert res[0]["step_count"] == res[1]["step_count"] == 80, report
    assert res[0]["params_hex"] == res[1]["params_hex"], report


# ------------------------------------------------------------ the command
def test_gradd_command_dispatches_run_and_execs_the_daemon_otherwise(run_env):
    """The wheel's `gradd` console script (gradd.run.cli:main)."""
    cli = [sys.executable, "-m", "gradd.run.cli"]
    p = subprocess.run(cli + ["--version"], env=run_env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("gradd "), p.stderr  # the daemon's
    p = subprocess.run(cli + ["run", "--nproc-per-node", "1", WORKER], capture_output=True,
                       text=True, timeout=120, env=dict(run_env, GRADD_TEST_STEPS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[rank0]:rank 0 done: 1 steps, 0 skipped" in p.stdout
    p = subprocess.run(cli + ["run", "--nproc-per-node", "0", WORKER], env=run_env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "gradd run: error: argument --nproc-per-node" in p.stderr


def test_scripts_gradd_runs_the_launcher_from_the_source_tree(run_env):
    """The README's first command: scripts/gradd sets up the tree (nothing
    to install or build here: the suite's build is current), then runs
    `gradd run` under Debian's python3 with the tree's package and daemon,
    or the daemon itself for any other arguments."""
    repo = os.path.normpath(os.path.join(HERE, "..", ".."))
    build = os.path.dirname(os.path.dirname(run_env["GRADD_BINARY"]))
    env = dict(run_env, GRADD_BUILD_DIR=build, GRADD_TEST_STEPS="2")
    # Not the suite's PYTHONPATH: the script must find the package itself.
    env.pop("PYTHONPATH", None)
    script = os.path.join(repo, "scripts", "gradd")
    p = subprocess.run([script, "--version"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0 and p.stdout.startswith("gradd "), p.stdout + p.stderr
    p = subprocess.run([script, "run", "--nproc-per-node", "2", WORKER], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in (0, 1):
        assert f"[rank{r}]:rank {r} done: 2 steps, 0 skipped" in p.stdout, p.stdout
    assert "daemon started for this launch" in p.stderr, p.stderr
