"""Worker processes of one job, started and restarted like a supervisor would:
the bookkeeping test_rank_restart.py and test_elastic_nodes.py share. A
subclass says how a rank is started (start) and whose logs follow a
report (daemon_logs)."""

import glob
import json
import os
import subprocess


class TrainerProcs:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.procs = {}
        self.finished = []  # (rank, returncode, stdout, stderr)

    def kill(self, rank):
        p = self.procs[rank]
        p.kill()
        p.communicate()

    def wait(self, rank, timeout):
        p = self.procs[rank]
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            out, err = p.communicate()
            err += b"\n[killed: timeout]"
        rec = (rank, p.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
        self.finished.append(rec)
        return rec

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()

    def daemon_logs(self):
        return ""

    def report(self):
        return "\n".join(f"--- rank {r}: exit {rc}\n{out}\n{err[-5000:]}"
                         for r, rc, out, err in self.finished) + \
            f"\n--- daemons\n{self.daemon_logs()}"

    def results(self):
        """Every report a rank's processes wrote, by rank."""
        by_rank = {}
        for path in glob.glob(os.path.join(self.out_dir, "rank*-*.json")):
            with open(path) as f:
                rep = json.load(f)
            by_rank.setdefault(rep["rank"], []).append(rep)
        return by_rank
