#!/usr/bin/python3
"""gradd-bench of this tree against the build of another revision, in one run.

Builds REV's daemon and bench out of tree (only the targets gradd and
gradd-bench, cached per commit), then runs REV's gradd-bench and this tree's
alternately (A B, B A, A B, ...; each bench with its own daemon, the same
sizes and iteration counts) and prints, per size, the median over the rounds
of each side's p50 and their ratio (this tree / REV: above 1 is slower):

    scripts/bench --against 7e4cb1b
    scripts/bench --against main --sizes 4KiB,1MiB --rounds 7
    /usr/bin/python3 bench/against.py --against HEAD --build-dir build

REV is read with `git archive` (nothing in .git is written) into
$GRADD_BENCH_CACHE/<sha>/src (default ~/.cache/gradd-bench) and built in
<sha>/build (Release, no tests, no Python); a finished build is reused.
GRADD_BUILD_LOCK=<file> holds that lock (flock) while compiling, to share
a machine's cores with other builds. Benchmarks print numbers; they are not
tests.
"""

import argparse
import fcntl
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
TARGETS = ("gradd", "gradd-bench")


def log(msg):
    print(f"[bench --against] {msg}", file=sys.stderr, flush=True)


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()


def resolve(rev):
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"bench --against: {rev!r} is not a commit of {REPO}")


class Lock:
    """flock on `path` (None: no lock) for the duration of a with-block."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def __enter__(self):
        if self.path:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)


def build_rev(sha, cache, jobs):
    """REV's build dir with gradd and gradd-bench in it (built if needed)."""
    root = cache / sha
    src, build = root / "src", root / "build"
    bench = build / "bench" / "gradd-bench"
    done = root / "built"
    root.mkdir(parents=True, exist_ok=True)
    # One builder per commit at a time; a second waits and then reuses.
    with Lock(str(root) + ".lock"):
        if done.exists() and bench.exists():
            return build
        if not (src / "CMakeLists.txt").exists():
            log(f"exporting {sha[:12]} into {src} (git archive)")
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir(parents=True)
            archive = subprocess.Popen(
                ["git", "-C", str(REPO), "archive", "--format=tar", sha],
                stdout=subprocess.PIPE)
            subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout,
                           check=True)
            archive.stdout.close()
            if archive.wait() != 0:
                shutil.rmtree(src, ignore_errors=True)
                sys.exit(f"bench --against: git archive {sha} failed")
        log(f"building {' '.join(TARGETS)} of {sha[:12]} in {build}")
        with Lock(os.environ.get("GRADD_BUILD_LOCK")):
            configure = [
                "cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release", "-DGRADD_BUILD_TESTS=OFF",
                "-DGRADD_BUILD_PYTHON=OFF", "-DGRADD_BUILD_BENCH=ON",
                "-DPython3_EXECUTABLE=/usr/bin/python3"]
            for cmd in (configure,
                        ["cmake", "--build", str(build), "--parallel",
                         str(jobs), "--target", *TARGETS]):
                proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
                if proc.returncode != 0:
                    sys.stderr.write(proc.stdout[-8000:])
                    sys.exit(f"bench --against: building {sha[:12]} failed: "
                             f"{' '.join(cmd)}")
        done.touch()
    return build


def run_bench(bench, args):
    cmd = [str(bench), f"--trainers={args.trainers}", f"--sizes={args.sizes}",
           f"--iters={args.iters}", f"--warmup={args.warmup}",
           "--format=json"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    rows = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["size_bytes"]] = row["p50_us"]
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(f"bench --against: {' '.join(cmd)} exited with status "
                 f"{proc.returncode}")
    return rows


def format_size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or n % 1024 or unit == "GiB":
            return f"{n}{unit}"
        n //= 1024
    return f"{n}GiB"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, metavar="REV",
                   help="the revision to compare with (any git rev)")
    p.add_argument("--build-dir", default=str(REPO / "build"),
                   help="this tree's build (with bench/gradd-bench)")
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--sizes", default="4KiB,64KiB,1MiB,25MiB")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5,
                   help="alternations of the two sides (default 5)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="parallel jobs for building REV")
    args = p.parse_args()
    if args.rounds < 1:
        sys.exit("bench --against: --rounds must be at least 1")

    sha = resolve(args.against)
    cache = pathlib.Path(os.environ.get(
        "GRADD_BENCH_CACHE",
        pathlib.Path(os.environ.get("XDG_CACHE_HOME",
                                    pathlib.Path.home() / ".cache"))
        / "gradd-bench"))
    old = build_rev(sha, cache, args.jobs) / "bench" / "gradd-bench"
    new = pathlib.Path(args.build_dir).resolve() / "bench" / "gradd-bench"
    if not new.exists():
        sys.exit(f"bench --against: {new} not built")

    sides = {"A": old, "B": new}
    p50s = {"A": {}, "B": {}}
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for side in order:
            for size, p50 in run_bench(sides[side], args).items():
                p50s[side].setdefault(size, []).append(p50)
        log(f"round {r + 1}/{args.rounds} done")

    print(f"# A = {args.against} ({sha[:12]}), built in "
          f"{old.parent.parent}")
    print(f"# B = the build in {new.parent.parent} (scripts/bench: this "
          "tree's)")
    print(f"# gradd-bench --trainers={args.trainers} --iters={args.iters} "
          f"--warmup={args.warmup}, {args.rounds} rounds alternating "
          "(A B, B A, ...), each bench with its own daemon")
    print("# p50 = median over the rounds of each round's p50 (us); "
          "range = lowest..highest round p50; ratio = B / A")
    print(f"{'size':>10} {'A p50':>10} {'B p50':>10} {'B/A':>7}   "
          f"{'A range':>17} {'B range':>17}")
    for size in sorted(set(p50s["A"]) & set(p50s["B"])):
        a, b = p50s["A"][size], p50s["B"][size]
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = mb / ma if ma > 0 else float("nan")
        print(f"{format_size(size):>10} {ma:>10.1f} {mb:>10.1f} "
              f"{ratio:>7.2f}   {min(a):>8.1f}..{max(a):<8.1f} "
              f"{min(b):>8.1f}..{max(b):<8.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
