#!/usr/bin/python3
"""Side-by-side training throughput: torch DDP (Gloo) vs gradd.torch DDP.

Also torch's own DDP over the torch.distributed backend "gradd"
(gradd/distributed.py: init_process_group("gradd"), mode torch_ddp_gradd),
when gradd._c10d is built.

Trains the same MLP (1024 -> 4096 -> 4096 -> 1024, ~25.2 M float32 parameters)
with batch 16 and one thread per process, 2 processes each, in one invocation,
and also without any communication (2 independent processes at the same time,
the ceiling). Starts its own gradd on a socket in a temporary directory.

    PYTHONPATH=build/client/python /usr/bin/python3 bench/compare_ddp.py \\
        [--gradd build/server/gradd] [--steps 20] [--warmup 3] [--json]

Prints steps/s for each mode (the slowest rank's; best of --rounds
alternating rounds), and gradd / torch DDP.

Allocator (--malloc, applied to every mode alike). Each backward allocates a
fresh 64 MiB gradient for the 4096x4096 weight; glibc serves blocks above
32 MiB with a new mmap every time, and on a VM each 4 KiB page fault costs
microseconds (about 150 ms per step here), so with plain glibc the run
measures page faults, not training or communication. PyTorch's CPU tuning
guide recommends a reusing allocator (jemalloc/tcmalloc) for this reason;
the default here, `thp`, keeps glibc and sets GLIBC_TUNABLES=
glibc.malloc.hugetlb=1 (glibc >= 2.35) so large blocks get transparent huge
pages, which needs nothing installed. `--malloc glibc` measures the plain
default.

Several nodes (scripts/netbench runs this across emulated nodes):
--nodes N runs one gradd per node and --procs trainers on each (N x procs
ranks, torchrun's environment: GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
...). --node-exec "ip netns exec NS{node}" runs node k's daemon and workers
under that prefix; --master-addr is node 0's address (torch's store and
gradd's coordinator host: the daemon there serves the rendezvous on
demand); --gloo-ifname sets GLOO_SOCKET_IFNAME for torch's workers;
--comm-hook gives the gradd daemons a default_comm_hook (e.g. bf16_compress;
torch DDP stays uncompressed, as DDP runs by default).
--compile on runs every mode with the DDP model under torch.compile
(torch 2: `torch.compile(DistributedDataParallel(model))`, torch's and
gradd's alike, dynamo's DDPOptimizer splitting the graph at the buckets;
no_comm compiles the plain model); --compile both runs each mode eager and
compiled ("<mode>+compile") in the same rounds. Under torch 1.x (no
torch.compile) the compiled variants are reported as not available.

Platforms: under scripts/debian13 (torch 2.6, Python 3.13) the defaults
follow $GRADD_BUILD_DIR (build-debian13/: its client/python and
server/gradd). --socket PATH uses a gradd already running there instead of
starting one (one node), e.g. a daemon built on the host serving the
Debian 13 root through a socket under the repository.
Benchmarks are not tests: nothing here asserts.
"""
import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODES = ("torch_ddp", "torch_ddp_gradd", "gradd", "no_comm")


def build_model(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024)
    )


def worker(args):
    import torch

    torch.set_num_threads(args.threads)
    if args.compiled:
        # The compiled graphs' first steps (warm-up) build their kernels: one
        # thread each, like the training itself, and no compile workers.
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = build_model(torch)
    if args.mode == "torch_ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.port}",
                                rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    elif args.mode == "torch_ddp_gradd":  # torch's DDP, collectives by the gradd daemons
        import torch.distributed as dist

        import gradd.distributed  # noqa: F401  (registers the backend "gradd")

        dist.init_process_group("gradd", init_method=f"tcp://{args.master_addr}:{args.port}",
                                rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    elif args.mode == "gradd":
        import gradd.torch

        model = gradd.torch.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    ddp = model
    if args.compiled:  # torch's recipe: compile the DDP-wrapped model
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=args.momentum)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 1024, generator=g)
    y = torch.randn(args.batch, 1024, generator=g)
    loss_fn = torch.nn.MSELoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    elapsed = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"rank": rank, "steps_per_s": args.steps / elapsed, "params": params,
                      "torch": torch.__version__}))
    if args.mode in ("torch_ddp", "torch_ddp_gradd"):
        torch.distributed.destroy_process_group()
    elif args.mode == "gradd":
        ddp.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MALLOC_TUNABLE = "glibc.malloc.hugetlb=1"


def malloc_env(choice):
    """Environment entries that select the allocator setting for workers."""
    if choice == "glibc":
        return {}
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    return {"GLIBC_TUNABLES": ":".join(tunables + [MALLOC_TUNABLE])}


def thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unknown"


def run_mode(mode, args, env_extra, sockets=None, compiled=False):
    procs = []
    port = free_port()
    world = args.procs * args.nodes
    for rank in range(world):
        node, local = divmod(rank, args.procs)
        env = dict(os.environ, **env_extra)
        env.update(malloc_env(args.malloc))
        env.update(RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(args.procs), GROUP_RANK=str(node),
                   GROUP_WORLD_SIZE=str(args.nodes), MASTER_ADDR=args.master_addr,
                   MASTER_PORT=str(port), OMP_NUM_THREADS=str(args.threads),
                   OPENBLAS_NUM_THREADS=str(args.threads))
        if sockets:
            env["GRADD_SOCKET"] = sockets[node]
        if args.gloo_ifname:
            env["GLOO_SOCKET_IFNAME"] = args.gloo_ifname
        if mode == "no_comm":  # independent processes running at the same time
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_WORLD_SIZE="1")
        cmd = node_prefix(args, node) + [
               sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
               "--port", str(port), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--threads", str(args.threads),
               "--bucket-cap-mb", str(args.bucket_cap_mb), "--momentum", str(args.momentum),
               "--master-addr", args.master_addr] + (["--compiled"] if compiled else [])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"{mode_key(mode, compiled)}: timed out after {args.timeout} s")
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"{mode_key(mode, compiled)}: worker failed ({p.returncode}):\n"
                             f"{err.decode()[-3000:]}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return min(r["steps_per_s"] for r in results), results[0]["params"], results[0]["torch"]


def mode_key(mode, compiled):
    return f"{mode}+compile" if compiled else mode


def torch_has_compile():
    """(torch's version, whether it has torch.compile), asked of the
    interpreter the workers run."""
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__, hasattr(torch, 'compile'))"],
        check=True, stdout=subprocess.PIPE).stdout.decode().split()
    return out[0], out[1] == "True"


def node_prefix(args, node):
    """The command prefix node `node`'s processes run under ([] without)."""
    return args.node_exec.replace("{node}", str(node)).split() if args.node_exec else []


def start_daemons(args, tmp):
    """One gradd per node; returns (processes, sockets, logs)."""
    gradd = find_gradd(args.gradd)
    config = None
    if args.comm_hook or args.reduce_threads:
        config = os.path.join(tmp, "gradd.yaml")
        with open(config, "w") as f:
            if args.reduce_threads:
                f.write(f"reduce_threads: {args.reduce_threads}\n")
            if args.comm_hook:
                f.write(f"default_comm_hook:\n  name: {args.comm_hook}\n")
    rendezvous_port = free_port() if not args.node_exec else 29600
    # Multi-node daemons need credentials (rendezvous.token_file): a fresh
    # random token in the run's private directory.
    token_file = os.path.join(tmp, "node-token")
    if args.nodes > 1:
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(24) + "\n")
    daemons, sockets, logs = [], [], []
    for node in range(args.nodes):
        sock = os.path.join(tmp, f"node{node}", "gradd.sock")
        log = open(os.path.join(tmp, f"gradd{node}.log"), "wb")
        cmd = node_prefix(args, node) + [gradd, "--socket", sock]
        if config:
            cmd += ["--config", config]
        if args.nodes > 1:
            cmd += ["--node-id", f"ddp-node{node}", "--rendezvous-port", str(rendezvous_port),
                    "--rendezvous-token-file", token_file]
        daemons.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))
        sockets.append(sock)
        logs.append(log)
    deadline = time.monotonic() + 30
    for d, sock, log in zip(daemons, sockets, logs):
        while not (os.path.exists(sock) and os.path.exists(sock + ".session")):
            if d.poll() is not None or time.monotonic() > deadline:
                stop_daemons(daemons, logs)
                raise SystemExit("gradd did not start; log: " + open(log.name).read()[-2000:])
            time.sleep(0.05)
    return daemons, sockets, logs


def stop_daemons(daemons, logs):
    for d in daemons:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
    for d in daemons:
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
    for log in logs:
        log.close()


def backend_built(pythonpath):
    """Whether gradd._c10d (torch_ddp_gradd's backend) is on `pythonpath`."""
    import glob

    return any(glob.glob(os.path.join(d, "gradd", "_c10d*.so")) for d in pythonpath.split(":") if d)


def build_dir():
    """The platform's build directory: $GRADD_BUILD_DIR (scripts/debian13
    sets it), else build/."""
    return os.environ.get("GRADD_BUILD_DIR") or os.path.join(REPO, "build")


def find_gradd(arg):
    for cand in (arg, os.environ.get("GRADD_BINARY"), os.path.join(build_dir(), "server/gradd"),
                 shutil.which("gradd")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise SystemExit("gradd binary not found: pass --gradd or set GRADD_BINARY")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--gradd", help="gradd binary (default: $GRADD_BINARY, build/server/gradd)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best kept")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    ap.add_argument("--nodes", type=int, default=1, help="gradd daemons (nodes), --procs each")
    ap.add_argument("--reduce-threads", type=int, default=0,
                    help="the daemons' reduce_threads (0: their default, every core)")
    ap.add_argument("--node-exec", default="",
                    help='command prefix of node {node}\'s processes, e.g. "ip netns exec ns{node}"')
    ap.add_argument("--master-addr", default="127.0.0.1",
                    help="node 0's address (torch store, gradd coordinator host)")
    ap.add_argument("--gloo-ifname", default="", help="GLOO_SOCKET_IFNAME for torch's workers")
    ap.add_argument("--comm-hook", default="",
                    help="the gradd daemons' default_comm_hook (e.g. bf16_compress)")
    ap.add_argument("--malloc", choices=("thp", "glibc"), default="thp",
                    help="allocator setting for every mode (see the module docstring)")
    ap.add_argument("--compile", choices=("off", "on", "both"), default="off",
                    help="torch.compile the (DDP) model: off, on, or both variants of each mode")
    ap.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", default="",
                    help="a running gradd's socket to use instead of starting one (one node)")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    if args.socket and (args.nodes != 1 or args.comm_hook or args.reduce_threads):
        raise SystemExit("--socket: one node, and the running daemon's own configuration")
    tmp = tempfile.mkdtemp(prefix="gradd-bench-")
    daemons, sockets, logs = ([], [], [])
    variants = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    notes = {}
    if True in variants:
        version, has_compile = torch_has_compile()
        if not has_compile:
            notes["compile"] = f"torch {version} has no torch.compile"
            print(f"# compiled variants not available: {notes['compile']}", file=sys.stderr)
            variants = [v for v in variants if not v]
    try:
        if {"gradd", "torch_ddp_gradd"} & set(args.modes.split(",")):
            if args.socket:
                sockets = [args.socket]
            else:
                daemons, sockets, logs = start_daemons(args, tmp)
        pythonpath = os.environ.get("PYTHONPATH", "")
        if not pythonpath:
            pythonpath = os.path.join(build_dir(), "client/python")
        env = {"GRADD_JOB": "compare-ddp", "PYTHONPATH": pythonpath}
        modes = args.modes.split(",")
        if "torch_ddp_gradd" in modes and not backend_built(pythonpath):
            notes["torch_ddp_gradd"] = ("gradd._c10d (the torch.distributed backend) "
                                        "is not built")
            print(f"# torch_ddp_gradd skipped: {notes['torch_ddp_gradd']}", file=sys.stderr)
            modes.remove("torch_ddp_gradd")
        rates, params, torch_version = {}, 0, ""
        # Modes alternate over rounds and each keeps its best round, so a
        # burst of load from elsewhere does not decide the ratio.
        for rnd in range(args.rounds):
            for compiled in variants:
                for mode in modes:
                    key = mode_key(mode, compiled)
                    env["GRADD_JOB"] = f"compare-ddp-{key.replace('+', '-')}-{rnd}"
                    rate, params, torch_version = run_mode(mode, args, env, sockets, compiled)
                    rates[key] = max(rates.get(key, 0.0), rate)
    finally:
        stop_daemons(daemons, logs)
        shutil.rmtree(tmp, ignore_errors=True)

    summary = {
        "params": params, "procs": args.procs, "nodes": args.nodes,
        "comm_hook": args.comm_hook or "allreduce", "batch": args.batch, "threads": args.threads,
        "steps": args.steps, "rounds": args.rounds, "steps_per_s": rates,
        "malloc": args.malloc, "thp": thp_mode(), "torch": torch_version,
        "python": sys.version.split()[0],
    }
    if notes:
        summary["not_available"] = notes
    ratios = (("gradd_over_torch_ddp", "gradd", "gradd / torch DDP"),
              ("torch_ddp_gradd_over_torch_ddp", "torch_ddp_gradd",
               "torch DDP over the gradd backend / torch DDP over Gloo"),
              ("ceiling_over_torch_ddp", "no_comm", "no-communication / torch DDP (ceiling)"))
    lines = []
    for compiled in variants:
        for name, mode, text in ratios:
            num, den = mode_key(mode, compiled), mode_key("torch_ddp", compiled)
            if num in rates and den in rates:
                key = f"compile_{name}" if compiled else name
                summary[key] = rates[num] / rates[den]
                lines.append(f"{text}{' (torch.compile)' if compiled else ''}: {summary[key]:.2f}x")
    if args.json:
        print(json.dumps(summary))
        return
    print(f"MLP 1024-4096-4096-1024 ({params / 1e6:.1f} M params), batch {args.batch}, "
          f"{args.nodes} node(s) x {args.procs} processes x {args.threads} thread(s), "
          f"gradd hook {summary['comm_hook']}, {args.steps} steps after "
          f"{args.warmup} warm-up, best of {args.rounds} round(s)")
    print(f"allocator: {args.malloc} for every mode (transparent_hugepage: {thp_mode()}); "
          f"torch {torch_version}, Python {summary['python']}")
    print(f"{'mode':<24}{'steps/s':>10}")
    for mode, r in rates.items():
        print(f"{mode:<24}{r:>10.2f}")
    for line in lines:
        print(line)
    for what, why in notes.items():
        print(f"not available: {what}: {why}")


if __name__ == "__main__":
    main()
