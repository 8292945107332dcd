"""What the soaks share (test_rank_restart_soak.py: trainers of one daemon
killed and restarted; test_elastic_soak.py: trainers and whole nodes of a
3-node job): the C++ example trainer in its restart-safe training mode
(examples/cpp/trainer.cc --mode train), its FINAL / STEP lines, and a
daemon's fds, threads and resident memory (the leak checks).

Leaks: a daemon's fds and threads must come back to (at most) a baseline,
except gRPC's executors ("default-executor", "resolver-executor"), which
start threads on demand up to 2 x cores and keep them for the process's
life (grpc_core::Executor): bounded, not a leak. gRPC's other pools (event
engine, timers) give extra threads back after an idle while, hence the wait
(up to SETTLE_S) before a count is judged. Memory: within RSS_SLACK_KB of
the baseline: a coarse bound, for a leak of the order of the job's buffers
per event. glibc keeps pages of its per-thread arenas that scattered live
chunks pin, even after malloc_trim: in the multi-node soak the
coordinator's RSS climbs 0.3-0.6 MiB per re-formation (flat between
events, not given back when the job ends) while its live heap stays under
1 MiB (heaptrack, 16 events: 764 KiB live at the end, 3.2 MiB peak), so a
tight bound would fail on the allocator, not on gradd. The multi-node soak
prints the RSS after each event to show a trend.
"""
import collections
import os
import re
import subprocess
import time

# Thread names (15 characters) of gRPC's executors.
GRPC_EXECUTORS = ("default-executo", "resolver-execut")
# gRPC's synchronous server (the coordinator's rendezvous service): idle
# pollers plus one thread per call in progress, so the count at any moment
# swings with the nodes' blocking store calls (every node of an elastic job
# beats and waits for arrivals every 200 ms), bounded by the server's
# thread cap; a swing of a few is not a leak.
GRPC_SYNC_SERVER = "grpcpp_sync_ser"
GRPC_SYNC_SERVER_SWING = 4
SETTLE_S = 30
RSS_SLACK_KB = 64 * 1024
# Under AddressSanitizer freed memory waits in its quarantine (256 MiB by
# default), so RSS says nothing there; LeakSanitizer checks the daemon's
# heap when it exits instead.
SANITIZED = any(s in os.environ.get("LD_PRELOAD", "") for s in ("libasan", "libtsan"))
FINAL = re.compile(r"FINAL .*live=(\d+) .*steps=(\d+) checksum=([0-9a-f]+)")
STEP = re.compile(r"rank (\d+): STEP (\d+) t_ns=(\d+)")
SYNCED = re.compile(r"rank (\d+): SYNCED .* live=(\d+) .*t_ns=(\d+)")


def trainer_or_skip(pytest):
    path = os.environ.get("GRADD_EXAMPLE_TRAINER", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("GRADD_EXAMPLE_TRAINER is not set (run under ctest)")
    return path


def spawn_trainer(trainer, socket, job, local_rank, local_world, steps, sleep_ms, grace_ms,
                  params, log_path, env=None, extra=()):
    """One example trainer in --mode train, its output (stdout and stderr)
    in log_path; the process has .log_path."""
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            trainer, "--socket", socket, "--job", job,
            "--local-rank", str(local_rank), "--local-world-size", str(local_world),
            "--mode", "train", "--iterations", str(steps),
            "--params", str(params), "--rank-restart-grace-ms", str(grace_ms),
            "--step-sleep-ms", str(sleep_ms), *extra,
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=full_env,
    )
    proc.log_path = log_path
    log.close()
    return proc


def read(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def finals(outs):
    """(live, steps, checksum) of each output's FINAL line."""
    res = []
    for out in outs:
        m = FINAL.search(out)
        assert m, f"no FINAL line in:\n{out[-3000:]}"
        res.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    return res


def checksums(outs):
    """(steps, checksum) of each output's FINAL line."""
    return [(steps, checksum) for _, steps, checksum in finals(outs)]


def proc_stats(pid):
    """(open fds, threads, VmRSS in kB) of process pid."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+)", f.read())
    if not m:  # a zombie: its memory is gone
        raise RuntimeError(f"process {pid} has ended")
    return fds, threads, int(m.group(1))


def thread_names(pid):
    names = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:  # ended between the listing and the read
            pass
    return names


class Baseline:
    """A daemon's fds, threads (by name) and RSS at one moment."""

    def __init__(self, pid):
        self.pid = pid
        self.fds, self.threads, self.rss_kb = proc_stats(pid)
        self.names = thread_names(pid)

    def leaks(self, fd_slack=0, settle_s=SETTLE_S):
        """Waits up to settle_s for the daemon to come back to this baseline
        (fds within fd_slack of it, no thread of a new name or count beyond
        gRPC's bounded executors); returns (problems, now): a list of what is
        still above it (empty: no leak) and the last reading."""
        cap = 2 * (os.cpu_count() or 1)
        deadline = time.monotonic() + settle_s
        while True:
            fds, threads, rss_kb = proc_stats(self.pid)
            names = thread_names(self.pid)
            more = {n: c for n, c in (names - self.names).items()
                    if not (n in GRPC_EXECUTORS and names[n] <= cap)
                    and not (n == GRPC_SYNC_SERVER and c <= GRPC_SYNC_SERVER_SWING)}
            problems = []
            if fds > self.fds + fd_slack:
                problems.append(f"fds {self.fds} -> {fds} (slack {fd_slack})")
            if more:
                problems.append(f"threads {self.threads} -> {threads}: more {dict(names - self.names)}, "
                                f"fewer {dict(self.names - names)}")
            if rss_kb - self.rss_kb >= RSS_SLACK_KB and not SANITIZED:
                problems.append(f"RSS {self.rss_kb} kB -> {rss_kb} kB")
            if not problems or time.monotonic() > deadline:
                return problems, (fds, threads, rss_kb)
            time.sleep(0.5)
