#!/usr/bin/python3
"""Side-by-side training throughput: torch DDP (Gloo) vs gradd.torch DDP.

Also torch's own DDP over the torch.distributed backend "gradd"
(gradd/distributed.py: init_process_group("gradd"), mode torch_ddp_gradd),
when gradd._c10d is built.

Trains the same MLP (1024 -> 4096 -> 4096 -> 1024, ~25.2 M float32 parameters;
--model deep: 25 Linear 1024 -> 1024 layers with ReLUs between, ~26.2 M)
with batch 16 and one thread per process, 2 processes each, in one invocation,
and also without any communication (2 independent processes at the same time,
the ceiling). Starts its own gradd on a socket in a temporary directory.

Mode gradd_overlap (--modes): gradd.torch with
_register_fused_optim(SGD, ..., overlap_forward=True) (gradd/_overlap.py:
no optimizer.step(); the next forward waits for, and steps, each layer's
buckets as it reaches them). --scheduling none,priority runs every mode
that uses gradd once per daemon `scheduling:` value (daemons started with
it, plus --partition-mb / --daemon-config-extra), as <mode>@<value>. Each
mode reports its iteration time (p50 and min-max over every timed step of
the slowest rank), the gradd variants' p50 ratio against the first one,
and rank 0's final parameters against the first gradd run's (max abs
difference; 0 = bitwise equal, what scheduling and overlap must give).

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
# gradd_overlap: gradd.torch with the optimizer fused into DDP and the next
# forward overlapped with the last buckets' reduction
# (_register_fused_optim(SGD, ..., overlap_forward=True), gradd/_overlap.py).
GRADD_MODES = ("gradd", "gradd_overlap")
ALL_MODES = MODES + ("gradd_overlap",)
MODELS = {
    "mlp": "MLP 1024-4096-4096-1024",
    "deep": "deep MLP, 24 x (Linear 1024-1024 + ReLU) + Linear 1024-1024",
}


def build_model(torch, name="mlp"):
    nn = torch.nn
    if name == "deep":  # 25 Linear layers of the same width (~26.2 M params)
        layers = []
        for _ in range(24):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(1024, 1024))
    return nn.Sequential(
        nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024)
    )


def cap_mb(text):
    """--bucket-cap-mb: MiB, or "auto" (gradd picks it; bench/autotune_sweep.py)."""
    return "auto" if text == "auto" else float(text)


def torch_cap(cap):
    """torch's DDP has no autotune: "auto" runs it with its default 25 MiB."""
    return 25 if cap == "auto" else cap


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
    model = build_model(torch, args.model)
    if args.mode == "torch_ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.port}",
                                rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=torch_cap(args.bucket_cap_mb))
    elif args.mode == "torch_ddp_gradd":  # torch's DDP, collectives by the gradd daemons
        import torch.distributed as dist

        import gradd.distributed  # noqa: F401  (registers the backend "gradd")

        dist.init_process_group("gradd", init_method=f"tcp://{args.master_addr}:{args.port}",
                                rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=torch_cap(args.bucket_cap_mb))
    elif args.mode in GRADD_MODES:
        import gradd.torch

        model = gradd.torch.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    ddp = model
    if args.compiled:  # torch's recipe: compile the DDP-wrapped model
        model = torch.compile(model)
    sgd = dict(lr=1e-3, momentum=args.momentum)
    overlap = args.mode == "gradd_overlap"
    if overlap:  # the step moves into DDP (per bucket, in the next forward)
        ddp._register_fused_optim(torch.optim.SGD, **sgd, overlap_forward=True)
    else:
        opt = torch.optim.SGD(model.parameters(), **sgd)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 1024, generator=g)
    y = torch.randn(args.batch, 1024, generator=g)
    loss_fn = torch.nn.MSELoss()

    def step():
        if overlap:
            ddp.zero_grad()  # deferred until the pending step is done
            loss_fn(model(x), y).backward()
            return
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    if overlap:
        ddp.wait_gradients()  # the last step (timed: the loop's work)
        times[-1] += time.perf_counter() - t0 - sum(times)
    elapsed = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    out = {"rank": rank, "steps_per_s": args.steps / elapsed, "params": params,
           "torch": torch.__version__, "step_s": times}
    if overlap:
        out["overlap"] = dict(ddp._overlap.stats)
    if args.param_dump and rank == 0:  # the final parameters, for the comparison
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
        torch.save(flat, args.param_dump)
    print(json.dumps(out))
    if args.mode in ("torch_ddp", "torch_ddp_gradd"):
        torch.distributed.destroy_process_group()
    elif args.mode in GRADD_MODES:
        ddp.shutdown()


def compare_params(dumps):
    """Rank 0's final parameters of every run that dumped them (the last
    round), against the first gradd run's: {"<key> vs <base>": max abs
    difference} (0.0: bitwise equal, as scheduling and forward overlap must
    leave them); torch's runs are compared too (rounding differs)."""
    import torch

    loaded = {k: torch.load(p) for k, p in dumps.items() if os.path.exists(p)}
    base = next((k for k in loaded if k.split("@")[0] in GRADD_MODES), None)
    if base is None:
        return {}
    out = {}
    for key, flat in loaded.items():
        if key != base:
            same = torch.equal(flat, loaded[base])
            out[f"{key} vs {base}"] = 0.0 if same else (flat - loaded[base]).abs().max().item()
    return out


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


def run_mode(mode, args, env_extra, sockets=None, compiled=False, dump=None):
    """Runs `mode` on every rank; returns (steps/s of the slowest rank,
    params, torch version, per-step seconds of the slowest rank, rank 0's
    overlap statistics or None). `dump`: where rank 0 saves its final
    parameters (one flat tensor)."""
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
               "--master-addr", args.master_addr, "--model", args.model,
               "--param-dump", dump or ""] + (["--compiled"] if compiled else [])
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
    slowest = min(results, key=lambda r: r["steps_per_s"])
    return (slowest["steps_per_s"], results[0]["params"], results[0]["torch"],
            slowest["step_s"], results[0].get("overlap"))


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


def daemon_config(args, scheduling=""):
    """The daemons' gradd.yaml lines: --reduce-threads, --comm-hook, the
    variant's `scheduling` (priority|none; "" leaves the daemon's default;
    "priority+p4": that variant with partition_mb 4, overriding
    --partition-mb, so one run can set a partitioned priority variant beside
    the old whole-bucket behaviour), --partition-mb and --daemon-config-extra
    (YAML lines, "\\n" for new lines)."""
    lines = []
    scheduling, _, variant_partition = scheduling.partition("+p")
    if args.reduce_threads:
        lines.append(f"reduce_threads: {args.reduce_threads}")
    if args.comm_hook:
        lines.append(f"default_comm_hook:\n  name: {args.comm_hook}")
    if scheduling:
        lines.append(f"scheduling: {scheduling}")
    if variant_partition:
        lines.append(f"partition_mb: {float(variant_partition):g}")
    elif args.partition_mb:
        lines.append(f"partition_mb: {args.partition_mb:g}")
    if args.daemon_config_extra:
        lines.append(args.daemon_config_extra.replace("\\n", "\n"))
    return "".join(line + "\n" for line in lines)


def start_daemons(args, tmp, scheduling=""):
    """One gradd per node; returns (processes, sockets, logs)."""
    gradd = find_gradd(args.gradd)
    config = None
    text = daemon_config(args, scheduling)
    if text:
        config = os.path.join(tmp, f"gradd-{scheduling or 'default'}.yaml")
        with open(config, "w") as f:
            f.write(text)
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
        sock = os.path.join(tmp, f"node{node}-{scheduling or 'default'}", "gradd.sock")
        log = open(os.path.join(tmp, f"gradd{node}-{scheduling or 'default'}.log"), "wb")
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
    ap.add_argument("--mode", choices=ALL_MODES, help=argparse.SUPPRESS)
    ap.add_argument("--param-dump", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp",
                    help="mlp: 1024-4096-4096-1024 (25.2 M params); deep: 25 Linear "
                         "1024-1024 layers with ReLUs (26.2 M params)")
    ap.add_argument("--scheduling", default="",
                    help="comma-separated daemon `scheduling:` values (e.g. none,priority,priority+p4: "
                         "+pN sets that variant's partition_mb to N); "
                         "the modes that use gradd run once per value, on daemons started "
                         "with it, as <mode>@<value> (default: the daemons' own setting)")
    ap.add_argument("--partition-mb", type=float, default=0,
                    help="the daemons' partition_mb (0: their default)")
    ap.add_argument("--daemon-config-extra", default="",
                    help="more gradd.yaml lines for the daemons (\\n between lines)")
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--gradd", help="gradd binary (default: $GRADD_BINARY, build/server/gradd)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best kept")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--bucket-cap-mb", type=cap_mb, default=25,
                    help="MiB, or auto: gradd's autotune (torch's modes keep 25)")
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of " + ",".join(ALL_MODES) + " (gradd_overlap: "
                         "gradd.torch with _register_fused_optim(SGD, overlap_forward=True))")
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

    if args.socket and (args.nodes != 1 or args.comm_hook or args.reduce_threads
                        or args.scheduling or args.partition_mb or args.daemon_config_extra):
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
    schedulings = [v.strip() for v in args.scheduling.split(",") if v.strip()] or [""]
    runs = {}  # key -> list of (steps/s, per-step seconds of the slowest rank)
    overlap_stats, dumps = {}, {}
    try:
        pythonpath = os.environ.get("PYTHONPATH", "")
        if not pythonpath:
            pythonpath = os.path.join(build_dir(), "client/python")
        env = {"GRADD_JOB": "compare-ddp", "PYTHONPATH": pythonpath}
        modes = args.modes.split(",")
        for mode in modes:
            if mode not in ALL_MODES:
                raise SystemExit(f"--modes: unknown mode {mode!r} (of {', '.join(ALL_MODES)})")
        if "torch_ddp_gradd" in modes and not backend_built(pythonpath):
            notes["torch_ddp_gradd"] = ("gradd._c10d (the torch.distributed backend) "
                                        "is not built")
            print(f"# torch_ddp_gradd skipped: {notes['torch_ddp_gradd']}", file=sys.stderr)
            modes.remove("torch_ddp_gradd")
        daemon_modes = [m for m in modes if m in GRADD_MODES or m == "torch_ddp_gradd"]
        other_modes = [m for m in modes if m not in daemon_modes]
        params, torch_version = 0, ""

        def run(mode, key, rnd, compiled, sockets):
            nonlocal params, torch_version
            env["GRADD_JOB"] = f"compare-ddp-{key.replace('+', '-').replace('@', '-')}-{rnd}"
            dump = None
            if rnd == args.rounds - 1 and not compiled:  # the last round's parameters
                dump = dumps[key] = os.path.join(tmp, f"params-{len(dumps)}.pt")
            rate, params, torch_version, step_s, stats = run_mode(
                mode, args, env, sockets, compiled, dump=dump)
            runs.setdefault(key, []).append((rate, step_s))
            if stats:
                overlap_stats[key] = stats

        # Modes alternate over rounds and each keeps its best round, so a
        # burst of load from elsewhere does not decide the ratio.
        for rnd in range(args.rounds):
            for compiled in variants:
                for mode in other_modes:
                    run(mode, mode_key(mode, compiled), rnd, compiled, None)
                for sched in schedulings if daemon_modes else []:
                    if args.socket:
                        sockets = [args.socket]
                    else:
                        daemons, sockets, logs = start_daemons(args, tmp, sched)
                    try:
                        for mode in daemon_modes:
                            key = mode_key(mode, compiled) + (f"@{sched}" if sched else "")
                            run(mode, key, rnd, compiled, sockets)
                    finally:
                        stop_daemons(daemons, logs)
                        daemons, logs = [], []
        param_diffs = compare_params(dumps)
    finally:
        stop_daemons(daemons, logs)
        shutil.rmtree(tmp, ignore_errors=True)

    rates = {k: max(r for r, _ in v) for k, v in runs.items()}
    iter_ms = {}
    for key, v in runs.items():
        steps = sorted(t * 1e3 for _, ts in v for t in ts)
        iter_ms[key] = {"p50": steps[len(steps) // 2], "min": steps[0], "max": steps[-1]}
    summary = {
        "params": params, "procs": args.procs, "nodes": args.nodes,
        "comm_hook": args.comm_hook or "allreduce", "batch": args.batch, "threads": args.threads,
        "steps": args.steps, "rounds": args.rounds, "steps_per_s": rates,
        "malloc": args.malloc, "thp": thp_mode(), "torch": torch_version,
        "python": sys.version.split()[0], "model": args.model, "iter_ms": iter_ms,
        "scheduling": args.scheduling, "partition_mb": args.partition_mb,
        "momentum": args.momentum, "bucket_cap_mb": args.bucket_cap_mb,
    }
    if overlap_stats:
        summary["overlap_stats"] = overlap_stats
    if param_diffs:
        summary["param_max_abs_diff"] = param_diffs
    gradd_keys = [k for k in iter_ms if k.split("@")[0].split("+")[0] in GRADD_MODES]
    if len(gradd_keys) > 1:  # every gradd variant against the first one
        base = gradd_keys[0]
        summary["iter_speedup_over"] = {"base": base, **{
            k: iter_ms[base]["p50"] / iter_ms[k]["p50"] for k in gradd_keys[1:]}}
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
    print(f"{MODELS[args.model]} ({params / 1e6:.1f} M params), batch {args.batch}, "
          f"{args.nodes} node(s) x {args.procs} processes x {args.threads} thread(s), "
          f"gradd hook {summary['comm_hook']}, {args.steps} steps after "
          f"{args.warmup} warm-up, best of {args.rounds} round(s)")
    print(f"allocator: {args.malloc} for every mode (transparent_hugepage: {thp_mode()}); "
          f"torch {torch_version}, Python {summary['python']}")
    print(f"{'mode':<28}{'steps/s':>10}{'iter p50 ms':>13}{'min-max ms':>18}")
    for mode, r in rates.items():
        it = iter_ms[mode]
        print(f"{mode:<28}{r:>10.2f}{it['p50']:>13.1f}{it['min']:>9.1f}-{it['max']:<8.1f}")
    for line in lines:
        print(line)
    for key, ratio in summary.get("iter_speedup_over", {}).items():
        if key != "base":
            print(f"iteration p50 {summary['iter_speedup_over']['base']} / {key}: {ratio:.3f}x")
    for key, diff in param_diffs.items():
        print(f"final parameters {key}: max abs diff {diff:g}"
              + (" (bitwise equal)" if diff == 0 else ""))
    for key, stats in overlap_stats.items():
        print(f"{key}: buckets finished by submodule pre-hooks {stats['prehook_buckets']}, "
              f"at the end of a forward {stats['finish_buckets']} "
              f"({stats['iterations']} iterations)")
    for what, why in notes.items():
        print(f"not available: {what}: {why}")


if __name__ == "__main__":
    main()
