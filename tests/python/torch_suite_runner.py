"""Runs torch's own DDP tests (torch/testing/_internal/distributed/
distributed_test.py, shipped by Debian's python3-torch: 1.13 on Debian 12,
2.6 on Debian 13) with torch's DistributedDataParallel or with gradd's
swapped in.

Used by test_torch_ddp_suite.py; one run is one implementation at one world
size::

    BACKEND=gloo WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) GRADD_TORCH_SUITE_IMPL=gradd \\
    GRADD_SOCKET=/path/to/gradd.sock PYTHONPATH=build/client/python \\
        /usr/bin/python3 tests/python/torch_suite_runner.py --out r.json [TEST ...]

``--list`` prints the selected tests (every test of ``_DistTestBase`` whose
source, or the source of a ``self._helper`` it calls, transitively,
constructs a ``DistributedDataParallel``) and exits.

The test class is built the way torch's test/distributed/
test_distributed_spawn.py builds it (``TestDistBackend`` +
``DistributedTest._DistTestBase``, whose ``setUp`` starts one process per
rank, each running ``init_process_group`` on Gloo with a file:// store and
then the test). The rank processes are forked by default (each test starts
``WORLD_SIZE`` fresh processes; spawning them would re-import torch in every
one, several seconds of CPU per process, which the CI budget can't afford);
``GRADD_TORCH_SUITE_START=spawn`` spawns them as torch's own CI does.

Environment:
  BACKEND, WORLD_SIZE, TEMP_DIR   torch's harness's (BACKEND must be gloo)
  GRADD_TORCH_SUITE_IMPL          torch (default) or gradd: gradd replaces
                                  torch.nn.parallel.DistributedDataParallel
                                  and the name distributed_test imported
  GRADD_TORCH_SUITE_START         fork (default) or spawn
  GRADD_TORCH_SUITE_TIMEOUT       seconds one test may run (default 120)
  GRADD_TORCH_SUITE_BUDGET        seconds for the whole run (default: none);
                                  tests after it is spent fail as "not run"
  GRADD_SOCKET                    the gradd daemon (gradd only)

The result file maps each test to {"status": passed|failed|skipped,
"reason": first line of the error (and where distributed_test raised it) or
the skip reason, "detail": the end of the error report, "seconds": wall
time, "gradd_ddps": how many gradd DistributedDataParallel the rank
processes constructed, all ranks together}.
"""
import argparse
import importlib
import inspect
import json
import os
import re
import sys
import time
import types
import unittest

# torch's common_utils imports `expecttest` (a PyPI package Debian does not
# ship) only for assertExpectedInline, which no distributed test uses.
try:
    import expecttest  # noqa: F401
except ImportError:
    _shim = types.ModuleType("expecttest")
    _shim.ACCEPT = False
    _shim.TestCase = unittest.TestCase
    sys.modules["expecttest"] = _shim

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
# Read by common_distributed at import: how long the parent waits for the
# rank processes of one test before it kills them and fails the test.
os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = os.environ.get(
    "GRADD_TORCH_SUITE_TIMEOUT", os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")
)
if "TEMP_DIR" not in os.environ:
    sys.exit("torch_suite_runner: TEMP_DIR must name a scratch directory")

import torch  # noqa: E402
import torch.testing._internal.common_distributed as common_distributed  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

IMPL = os.environ.get("GRADD_TORCH_SUITE_IMPL", "torch")
START = os.environ.get("GRADD_TORCH_SUITE_START", "fork")

TORCH_MAJOR = int(torch.__version__.split(".")[0])

if TORCH_MAJOR == 1:
    # torch 1.13's harness (TestDistBackend._run) turns on DDP's experimental
    # ReplicatedTensor interop in every rank process; with it, torch's DDP
    # imports torch.distributed._shard, which torch 1.13 can't import on
    # Python 3.11 (a dataclass with a mutable default), so torch's own DDP
    # would fail every test. The rank processes keep DDP's default (off)
    # instead. (torch 2 has no such interop.)
    _rt_utils = importlib.import_module("torch.nn.parallel._replicated_tensor_ddp_utils")
    _rt_utils._set_ddp_with_replicated_tensor = lambda value: None

# Every test gets the same bound (torch raises it to 400 s for one test).
for _name in list(common_distributed.TIMEOUT_OVERRIDE):
    common_distributed.TIMEOUT_OVERRIDE[_name] = common_distributed.TIMEOUT_DEFAULT


def _swap_in_gradd():
    """Replaces torch's DDP with gradd's where distributed_test finds it:
    torch.nn.parallel.DistributedDataParallel (the tests write
    nn.parallel.DistributedDataParallel and
    torch.nn.parallel.DistributedDataParallel) and the module's own
    `from torch.nn.parallel import DistributedDataParallel`."""
    import functools

    from gradd.torch import DistributedDataParallel as GraddDDP

    # Each construction is counted (a line in $GRADD_TORCH_SUITE_MARKS),
    # so that the caller sees the swap took effect in every test.
    gradd_init = GraddDDP.__init__

    @functools.wraps(gradd_init)
    def counted_init(self, *args, **kwargs):
        marks = os.environ.get("GRADD_TORCH_SUITE_MARKS")
        if marks:
            with open(marks, "a") as f:
                f.write(f"{os.getpid()}\n")
        gradd_init(self, *args, **kwargs)

    GraddDDP.__init__ = counted_init
    torch.nn.parallel.DistributedDataParallel = GraddDDP
    distributed_test.DistributedDataParallel = GraddDDP


if IMPL == "gradd":
    _swap_in_gradd()
elif IMPL != "torch":
    sys.exit(f"torch_suite_runner: GRADD_TORCH_SUITE_IMPL={IMPL!r} is neither torch nor gradd")

_Base = DistributedTest._DistTestBase


class TestDistBackendWithSpawn(TestDistBackend, _Base):
    """As in torch's test_distributed_spawn.py: every test starts one
    process per rank."""

    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)


def _constructs_ddp(name, seen=None):
    """Whether _Base.<name>'s source, or that of a self._helper it calls
    (transitively), mentions DistributedDataParallel."""
    seen = set() if seen is None else seen
    if name in seen:
        return False
    seen.add(name)
    try:
        source = inspect.getsource(getattr(_Base, name))
    except (OSError, TypeError):
        return False
    if "DistributedDataParallel" in source:
        return True
    helpers = set(re.findall(r"self\.(_\w+)\s*\(", source))
    return any(hasattr(_Base, h) and _constructs_ddp(h, seen) for h in sorted(helpers))


def ddp_tests():
    """Every _DistTestBase test that constructs a DDP, sorted by name."""
    return [n for n in sorted(dir(_Base)) if n.startswith("test") and _constructs_ddp(n)]


class _Collector(unittest.TestResult):
    """Records one line per test; the rank processes' log goes to a file
    per test (their stderr), read back for skip reasons and errors."""

    def __init__(self):
        super().__init__()
        self.results = {}
        self._start = 0.0

    def startTest(self, test):
        super().startTest(test)
        self._start = time.monotonic()

    def _record(self, test, status, reason, detail=""):
        self.results[test._testMethodName] = dict(
            status=status,
            reason=reason,
            detail=detail[-6000:],
            seconds=round(time.monotonic() - self._start, 2),
        )

    def addSuccess(self, test):
        self._record(test, "passed", "")

    def addSkip(self, test, reason):
        self._record(test, "skipped", str(reason))

    def addError(self, test, err):
        self._fail(test, err)

    def addFailure(self, test, err):
        self._fail(test, err)

    def _fail(self, test, err):
        detail = self._exc_info_to_string(err, test)
        self._record(test, "failed", _first_error_line(detail), detail)


def _first_error_line(report):
    """The exception line of the first rank's traceback in torch's report
    ("Process 0 exited with error code 10 and exception:\\n<traceback>"),
    else the report's last exception line; followed by where in
    distributed_test.py it was raised."""
    lines = report.splitlines()
    exc, where = None, ""
    for i, line in enumerate(lines):
        if re.search(r"\bProcess \d+ exited with error code \d+ and exception:", line):
            for j in range(i + 2, len(lines)):
                later = lines[j]
                m = re.match(r'\s*File ".*distributed_test\.py", line (\d+), in (\w+)', later)
                if m:
                    code = lines[j + 1].strip() if j + 1 < len(lines) else ""
                    where = f" [distributed_test.py:{m.group(1)} {m.group(2)}: {code}]"
                if later and not later.startswith(" ") and not later.startswith("Traceback"):
                    exc = later.strip()
                    break
            break
    if exc is None:
        for line in reversed(lines):
            if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line):
                exc = line.strip()
                break
    if exc is None:
        exc = (lines[-1] if lines else "").strip()
    return (exc[:400] + where[:300]).strip()


def _child_skip_reason(log_text):
    m = re.findall(r"skipping test \w+ for following reason: (.*)", log_text)
    return m[0].strip() if m else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the selected tests")
    parser.add_argument("--out", help="JSON result file")
    parser.add_argument("--log-dir", help="keep each test's rank-process log here")
    parser.add_argument("tests", nargs="*", help="test names (default: every selected test)")
    opts = parser.parse_args()
    if os.environ["BACKEND"] != "gloo":
        sys.exit("torch_suite_runner: only BACKEND=gloo is supported")
    selected = ddp_tests()
    if opts.list:
        print("\n".join(selected))
        return 0
    names = opts.tests or selected
    unknown = [n for n in names if not hasattr(_Base, n)]
    if unknown:
        sys.exit(f"torch_suite_runner: no such tests: {', '.join(unknown)}")
    # common_utils parsed sys.argv at import; unittest needs it clean too.
    sys.argv = sys.argv[:1]
    collector = _Collector()
    TestDistBackendWithSpawn.setUpClass()  # MASTER_ADDR (unittest's suite would call it)
    log_dir = opts.log_dir or os.path.join(os.environ["TEMP_DIR"], "logs")
    os.makedirs(log_dir, exist_ok=True)
    saved_stderr = os.dup(2)
    budget = float(os.environ.get("GRADD_TORCH_SUITE_BUDGET", "0") or 0)
    started = time.monotonic()
    for name in names:
        if budget and time.monotonic() - started > budget:
            # Hanging tests must not take the whole CI run down with them.
            collector.results[name] = dict(
                status="failed", reason=f"not run: the run's {budget:g} s budget was spent",
                detail="", seconds=0, gradd_ddps=0,
            )
            print(f"{name}: not run (budget spent)", flush=True)
            continue
        log_path = os.path.join(log_dir, f"{name}.log")
        marks_path = os.path.join(log_dir, f"{name}.gradd-ddps")
        os.environ["GRADD_TORCH_SUITE_MARKS"] = marks_path
        with open(log_path, "wb") as log:
            # The rank processes inherit fd 2: their logging (skip reasons,
            # tracebacks) lands in this test's file.
            sys.stderr.flush()
            os.dup2(log.fileno(), 2)
            try:
                TestDistBackendWithSpawn(name).run(collector)
            finally:
                sys.stderr.flush()
                os.dup2(saved_stderr, 2)
        with open(log_path, "rb") as log:
            log_text = log.read().decode(errors="replace")
        result = collector.results.get(name)
        if result is None:
            collector.results[name] = result = dict(
                status="failed", reason="no result recorded", detail=log_text[-6000:], seconds=0
            )
        try:
            with open(marks_path) as f:
                result["gradd_ddps"] = len(f.read().split())
        except FileNotFoundError:
            result["gradd_ddps"] = 0
        if result["status"] == "skipped":
            # torch reports a skip inside a rank process only by exit code.
            result["reason"] = _child_skip_reason(log_text) or result["reason"]
        elif result["status"] == "failed" and "timed out" in result["reason"]:
            result["detail"] = (result["detail"] + "\n--- rank log\n" + log_text[-6000:])[-8000:]
        print(f"{name}: {result['status']} ({result['seconds']} s) {result['reason']}", flush=True)
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(collector.results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
