"""One rank of the DDP-semantics parity tests (test_semantics.py).

For each scenario named on the command line it builds the same model (same
seed, different initial weights on every rank so that a missing broadcast
shows) under torch's own DistributedDataParallel (Gloo) and under
gradd.torch.DistributedDataParallel, runs the same per-rank sequence of
forwards / backwards / optimizer steps on both (SGD with momentum and weight
decay, so a zero gradient and a None gradient lead to different parameters),
and after every step compares the `grad is None` pattern, the gradients, the
parameters and the buffers. Prints one JSON line: the failures found, how
many comparisons were made and a checksum of gradd's final parameters (which
must agree across ranks).

Args: SCENARIOS (comma-separated) GLOO_INIT_FILE STEPS.
Rank/world from RANK/WORLD_SIZE..., daemon from GRADD_SOCKET, job GRADD_JOB.
"""
import copy
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

import gradd.torch
from parity_util import rel_err

TOL = 1e-5
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
CAP_MB = 0.001  # a few hundred floats: several buckets even for tiny models


class Checker:
    def __init__(self, scenario):
        self.scenario = scenario
        self.failures = []
        self.checks = 0

    def fail(self, what):
        if len(self.failures) < 20:
            self.failures.append(f"{self.scenario} rank {RANK}: {what}")

    def grads(self, step, ref, ours, tag=""):
        for (n, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
            self.checks += 1
            if (p.grad is None) != (q.grad is None):
                self.fail(f"step {step}{tag} {n}: torch grad is "
                          f"{'None' if p.grad is None else 'a tensor'}, gradd's is "
                          f"{'None' if q.grad is None else 'a tensor'}")
            elif p.grad is not None and rel_err(q.grad, p.grad) > TOL:
                self.fail(f"step {step}{tag} {n}: grad differs by {rel_err(q.grad, p.grad):.3g}")

    def state(self, step, ref, ours, tag=""):
        for (n, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
            self.checks += 1
            if rel_err(q, p) > TOL:
                self.fail(f"step {step}{tag} param {n} differs by {rel_err(q, p):.3g}")
        for (n, p), (_, q) in zip(ref.named_buffers(), ours.named_buffers()):
            self.checks += 1
            if p.dtype.is_floating_point and rel_err(q, p) > TOL or (
                    not p.dtype.is_floating_point and not torch.equal(p, q)):
                self.fail(f"step {step}{tag} buffer {n} differs")


def seeded(build):
    torch.manual_seed(1000 + RANK)  # different initial weights per rank
    return build()


def pair(build, torch_kw=None, gradd_kw=None, set_static=False):
    """(torch DDP, gradd DDP) over copies of one seeded model."""
    model = seeded(build)
    torch_kw = dict(torch_kw or {})
    gradd_kw = dict(gradd_kw if gradd_kw is not None else torch_kw)
    ref = TorchDDP(copy.deepcopy(model), bucket_cap_mb=CAP_MB, **torch_kw)
    # A wrong pairing of backwards across ranks shows as a prompt error
    # instead of a hang.
    gradd_kw.setdefault("wait_timeout", 30)
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB, **gradd_kw)
    if set_static:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref._set_static_graph()
            ours._set_static_graph()
    return ref, ours


def sgd(ddp):
    return torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)


def data(step, n=6, d=8, salt=0):
    g = torch.Generator().manual_seed(10000 * salt + 100 * step + RANK)  # own data per rank
    return torch.randn(n, d, generator=g)


# ------------------------------------------------------------------ unused
class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        for name in "abcd":
            setattr(self, name, nn.Linear(8, 4))

    def forward(self, x, plan):
        h = torch.relu(self.body(x))
        out = torch.zeros(x.shape[0], 4)
        for name, scale in plan:
            out = out + scale * getattr(self, name)(h)
        return out


def heads_plan(step, rank):
    plan = [("c", 0.0 if rank == 1 else 1.0)]  # used everywhere, exactly 0 on rank 1
    if rank == step % WORLD:
        plan.append(("a", 1.0))  # used on one rank only
    if step == 1 and rank == 0:
        plan.append(("b", 0.0))  # used on one rank, with an exactly-zero gradient
    if (step + rank) % 2 == 0:
        plan.append(("d", 1.0))
    return plan  # "b" otherwise: used by nobody


def zero(opt, step):
    """Alternates set_to_none, zeros, and no zero_grad (stale gradients)."""
    if step % 3 == 0:
        opt.zero_grad(set_to_none=True)
    elif step % 3 == 1:
        opt.zero_grad(set_to_none=False)


def scenario_unused(chk, steps):
    ref, ours = pair(Heads, {"find_unused_parameters": True})
    opts = (sgd(ref), sgd(ours))
    for step in range(steps):
        x = data(step)
        for ddp, opt in zip((ref, ours), opts):
            zero(opt, step)
            ddp(x, heads_plan(step, RANK)).square().mean().backward()
        chk.grads(step, ref.module, ours.module)
        for opt in opts:
            opt.step()
        chk.state(step, ref.module, ours.module)
    return ours


def scenario_unused_stale(chk, steps):
    """Existing gradients of locally unused parameters, from a local backward
    (through ddp.module, or under no_sync) that leaves different gradients on each
    rank: a parameter somebody uses in the synced backward gets the average
    of everybody's gradients.

    A parameter nobody uses in the synced backward but that got a gradient in
    the local one: torch 1.13 forgets the local use and leaves each rank's
    gradient untouched, so its ranks end up with different gradients and
    models (a torch bug, fixed in torch 2.x, whose used map remembers use in
    local backwards). gradd does what torch 2.x does and keeps its ranks
    identical; the torch side here is brought to torch 2.x's result by
    averaging those gradients by hand."""
    ref, ours = pair(Heads, {"find_unused_parameters": True})
    opts = (sgd(ref), sgd(ours))
    local_heads = ("b", "a")
    for step in range(steps):
        x = data(step)
        for ddp, opt in zip((ref, ours), opts):
            zero(opt, step)
            local_plan = [(h, 1.0) for h in local_heads]
            if step >= 1 and step % 2 == 0:
                ddp.module(data(step, salt=4), local_plan).sum().backward()
            elif step >= 1:
                with ddp.no_sync():
                    ddp(data(step, salt=4), local_plan).sum().backward()
            ddp(x, heads_plan(step, RANK)).square().mean().backward()
        if step >= 1:
            used_in_sync = {h for r in range(WORLD) for h, _ in heads_plan(step, r)}
            for h in local_heads:
                if h in used_in_sync:
                    continue
                for p in getattr(ref.module, h).parameters():  # torch 2.x's result
                    g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                    dist.all_reduce(g)
                    p.grad = g / WORLD
        chk.grads(step, ref.module, ours.module)
        for opt in opts:
            opt.step()
        chk.state(step, ref.module, ours.module)
    return ours


# -------------------------------------------------------------- sync rules
def small_mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def scenario_sync_rules(chk, steps, view=False):
    kw = {"gradient_as_bucket_view": view}
    ref, ours = pair(small_mlp, kw)
    opts = (sgd(ref), sgd(ours))
    for step in range(steps):
        kind = step % 5
        for ddp, opt in zip((ref, ours), opts):
            opt.zero_grad(set_to_none=step % 2 == 0)
            x = data(step)
            if kind == 1 and RANK == 0:
                ddp.module(x).sum().backward()  # purely local on rank 0 only
            if kind == 2:
                with ddp.no_sync():
                    for _ in range(1 + RANK):  # uneven local accumulation
                        ddp(data(step, salt=1)).sum().backward()
            if kind == 3:
                for _ in range(1 + RANK):  # forwards never backpropagated
                    ddp(data(step, salt=2))
            if kind == 4 and RANK == WORLD - 1:
                ddp.require_backward_grad_sync = False
                ddp(data(step, salt=3)).sum().backward()
                ddp.require_backward_grad_sync = True
            ddp(x).square().mean().backward()  # the synced one
        chk.grads(step, ref.module, ours.module)
        for opt in opts:
            opt.step()
        chk.state(step, ref.module, ours.module)
    return ours


# ------------------------------------------------------------ static graph
class StaticNet(nn.Module):
    """A module reused in one forward, the same parameters in two reentrant
    checkpoints (their hooks fire twice per backward) and a parameter that
    is never used."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.shared = nn.Linear(8, 8)
        self.seg = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 4)
        self.head = nn.Linear(8, 4)

    def _seg(self, h):
        return torch.tanh(self.seg(h))

    def forward(self, x, ckpt=True):
        h = torch.relu(self.inp(x))
        h = self.shared(torch.relu(self.shared(h)))
        if ckpt:
            h = checkpoint(self._seg, h, use_reentrant=True)
            h = checkpoint(self._seg, h, use_reentrant=True)
        else:
            h = self._seg(self._seg(h))
        return self.head(h)


def scenario_static(chk, steps, via_setter=False):
    kw = {} if via_setter else {"static_graph": True}
    ref, ours = pair(StaticNet, kw, set_static=via_setter)
    opts = (sgd(ref), sgd(ours))
    for step in range(steps):
        x = data(step)
        for ddp, opt in zip((ref, ours), opts):
            zero(opt, step)
            ddp(x).square().mean().backward()
        chk.grads(step, ref.module, ours.module)
        for opt in opts:
            opt.step()
        chk.state(step, ref.module, ours.module)
    return ours


def scenario_twice_error(chk, steps):
    """Without static_graph a second hook firing is torch's error."""
    ref, ours = pair(StaticNet, {"find_unused_parameters": True})
    for ddp in (ref, ours):  # without checkpoints every hook fires once
        ddp(data(0, salt=6), ckpt=False).sum().backward()
    chk.grads(0, ref.module, ours.module)
    msgs = []
    for ddp in (ref, ours):
        try:
            ddp(data(0)).sum().backward()
            msgs.append(None)
        except RuntimeError as e:
            msgs.append(str(e))
    chk.checks += 1
    if msgs[0] is None or "Expected to mark a variable ready only once" not in msgs[0]:
        chk.fail(f"torch did not raise as expected: {msgs[0]}")
    if msgs[1] is None or "Expected to mark a variable ready only once" not in msgs[1] \
            or "seg.weight" not in msgs[1] and "seg.bias" not in msgs[1]:
        chk.fail(f"gradd did not raise torch's error naming the parameter: {msgs[1]}")
    return ours


# --------------------------------------------------------------------- GAN
def scenario_gan(chk, steps):
    def gen():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))

    def disc():
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    g_ref, g_ours = pair(gen)
    d_ref, d_ours = pair(disc)
    chk.checks += 1
    if g_ours.job_id == d_ours.job_id:
        chk.fail(f"generator and discriminator share job id {g_ours.job_id}")
    bce = nn.BCEWithLogitsLoss()
    sides = [(g_ref, d_ref, sgd(g_ref), sgd(d_ref)), (g_ours, d_ours, sgd(g_ours), sgd(d_ours))]
    for step in range(steps):
        real = data(step)
        z = data(step, n=6, d=4, salt=5)
        for G, D, opt_g, opt_d in sides:
            opt_d.zero_grad()
            fake = G(z)
            loss_d = bce(D(real), torch.ones(6, 1)) + bce(D(fake.detach()), torch.zeros(6, 1))
            loss_d.backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(D(fake), torch.ones(6, 1)).backward()
        chk.grads(step, g_ref.module, g_ours.module, " G")
        chk.grads(step, d_ref.module, d_ours.module, " D")
        for _, _, opt_g, _ in sides:
            opt_g.step()
        chk.state(step, g_ref.module, g_ours.module, " G")
        chk.state(step, d_ref.module, d_ours.module, " D")
    return g_ours


# ----------------------------------------------------------------- buffers
class BufNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.frozen = nn.Parameter(torch.randn(8), requires_grad=False)
        self.register_buffer("ema", torch.randn(8), persistent=False)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        h = self.lin(self.bn(x)) * self.frozen + self.ema
        with torch.no_grad():
            self.ema.mul_(0.5).add_(0.5 * h.mean(0))
            self.steps += 1 + RANK
        return h


def scenario_buffers(chk, steps, broadcast=True):
    ref, ours = pair(BufNet, {"broadcast_buffers": broadcast})
    chk.state(-1, ref.module, ours.module, " after construction")
    opts = (sgd(ref), sgd(ours))
    for step in range(steps):
        x = data(step)
        for ddp, opt in zip((ref, ours), opts):
            opt.zero_grad()
            ddp(x).square().mean().backward()
        chk.grads(step, ref.module, ours.module)
        for opt in opts:
            opt.step()
        chk.state(step, ref.module, ours.module)
    return ours


# ----------------------------------------------------------------- logging
MAIN_KEYS = [
    "world_size", "rank", "module_name", "device_ids", "output_device", "broadcast_buffers",
    "bucket_cap_bytes", "find_unused_parameters", "gradient_as_bucket_view", "backend_name",
    "iteration", "has_rebuilt_buckets", "bucket_sizes", "num_parameter_tensors",
    "total_parameter_size_bytes", "dtypes", "is_multi_device_module", "can_set_static_graph",
    "static_graph", "unused_parameter_size", "avg_forward_compute_time",
    "avg_backward_compute_time", "avg_backward_comm_time",
    "avg_backward_compute_comm_overlap_time",
]
SAME_VALUE = [
    "world_size", "rank", "module_name", "device_ids", "output_device", "broadcast_buffers",
    "bucket_cap_bytes", "find_unused_parameters", "gradient_as_bucket_view",
    "num_parameter_tensors", "total_parameter_size_bytes", "dtypes", "is_multi_device_module",
    # torch's last *sampled* iteration (recorded at the next synced forward).
    "iteration",
]


def scenario_logging(chk, steps):
    ref, ours = pair(small_mlp, {"find_unused_parameters": True})
    for step in range(2):
        for ddp in (ref, ours):
            ddp(data(step)).sum().backward()
    chk.grads(1, ref.module, ours.module)
    theirs, mine = ref._get_ddp_logging_data(), ours._get_ddp_logging_data()
    for k in MAIN_KEYS:
        chk.checks += 1
        if k not in mine:
            chk.fail(f"logging data lacks {k}")
        elif k in theirs and type(mine[k]) is not type(theirs[k]):
            chk.fail(f"logging data {k}: {type(mine[k]).__name__}, torch "
                     f"{type(theirs[k]).__name__}")
    for k in SAME_VALUE:
        chk.checks += 1
        if mine.get(k) != theirs.get(k):
            chk.fail(f"logging data {k}: gradd {mine.get(k)!r}, torch {theirs.get(k)!r}")
    if mine["iteration"] != 1 or mine["static_graph"] != 0 or mine["avg_backward_comm_time"] <= 0:
        chk.fail(f"logging data counters: {mine}")
    return ours


# Scenarios whose per-rank models legitimately differ (none so far).
RANKS_MAY_DIFFER = set()

SCENARIOS = {
    "unused": scenario_unused,
    "unused_stale": scenario_unused_stale,
    "sync_rules": scenario_sync_rules,
    "sync_rules_view": lambda c, s: scenario_sync_rules(c, s, view=True),
    "static": scenario_static,
    "static_setter": lambda c, s: scenario_static(c, s, via_setter=True),
    "twice_error": scenario_twice_error,
    "gan": scenario_gan,
    "buffers": scenario_buffers,
    "buffers_off": lambda c, s: scenario_buffers(c, s, broadcast=False),
    "logging": scenario_logging,
}


def main():
    names, init_file, steps = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=RANK,
                            world_size=WORLD)
    results = []
    for name in names:
        chk = Checker(name)
        ours = SCENARIOS[name](chk, steps)
        flat = []
        if ours is not None:
            flat = [p.detach().double().sum().item() for p in ours.module.parameters()]
            ours.shutdown()
        if name in RANKS_MAY_DIFFER:
            flat = []
        results.append({"scenario": name, "failures": chk.failures, "checks": chk.checks,
                        "checksum": flat})
        dist.barrier()  # scenarios start together, as their job ids do
    print(json.dumps({"rank": RANK, "results": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
