"""One rank of the trainer-side communication-hook parity tests
(gradd/_trainer_hooks.py): trains the same model with torch's
DistributedDataParallel (Gloo) and gradd.torch side by side in this process,
the same hook registered on both (each its own state), and after every step
compares gradients and parameters. Prints one JSON line.

Args: HOOK GLOO_INIT_FILE STEPS. HOOK: user_then, noop, record,
quant_pertensor, quant_perchannel, post_localsgd, post_localsgd_noallreduce,
fused_sgd, unused_then (find_unused_parameters with a user hook), static_then
(static_graph=True with a user hook), group_none / group_pg (the user hook
with state None / state = the DDP's process group: gradd hands it the job's
gradd group), group_fallback (state None with gradd._c10d unavailable: the
hook uses the Gloo group), powersgd_wrapped (torch's PowerSGD wrapped in a
user function, PowerSGDState over the default group: a view of the state
with the gradd group).

The group_* and powersgd modes also report what the hook's state was on
gradd's side, how many collectives gradd's training issued on the Gloo
default group (its sequence number before and after each gradd step), and
(rank 0, with GRADDCTL_BINARY set) graddctl's view of the job's
``<job>/trainer-hooks`` job while both ranks are attached.
"""
import copy
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import (
    debugging_hooks,
    post_localSGD_hook,
    powerSGD_hook,
    quantization_hooks,
)
from torch.distributed.algorithms.model_averaging import averagers
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.distributed
import gradd.torch
import models
from parity_util import init_gloo, rel_err

CAP_MB = 0.01  # ~10 KB: several buckets for the MLP
START_LOCAL_SGD = 2


def allreduce_then_divide(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A user-written hook: allreduce the bucket, divide in a .then."""
    world = dist.get_world_size(state)
    fut = dist.all_reduce(bucket.buffer(), group=state, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def recording(hook, seen):
    """`hook`, noting what its state was (type, backend, whether
    dist.get_rank(state) answers this rank's group rank)."""
    def run(state, bucket):
        group = state if state is None or isinstance(state, dist.ProcessGroup) else \
            state.process_group
        if group is None:
            kind = "None"
        else:
            rank_ok = dist.get_rank(group) == dist.get_rank()
            kind = f"{type(group).__name__}/{dist.get_backend(group)}/rank_ok={rank_ok}"
        if kind not in seen:
            seen.append(kind)
        return hook(state, bucket)
    run.__name__ = hook.__name__
    return run


def wrapped_powersgd(state, bucket):
    """torch's PowerSGD hook, not recognised as such: runs in the trainer."""
    return powerSGD_hook.powerSGD_hook(state, bucket)


def graddctl_job(job):
    """graddctl's JSON view of `job` (GRADDCTL_BINARY, the test's daemon)."""
    out = subprocess.run(
        [os.environ["GRADDCTL_BINARY"], "--socket", os.environ["GRADD_SOCKET"], "--json", "job",
         job], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return {"error": out.stderr}
    detail = json.loads(out.stdout)["job"]
    return {"state": detail["summary"]["state"],
            "live": detail["summary"]["live_local_ranks"],
            "pids": sorted(r["pid"] for r in detail["ranks"])}


class Recorder:
    """State of the recording hook: what each call saw, then the allreduce."""

    def __init__(self, names):
        self.names = names  # id(param) -> name
        self.calls = []

    def hook(self, state, bucket):
        buf = bucket.buffer()
        grads = bucket.gradients()
        params = bucket.parameters()
        offsets_ok = all(
            g.data_ptr() == buf.data_ptr() + sum(p.numel() for p in params[:k]) * buf.element_size()
            for k, g in enumerate(grads)
        )
        grads_ok = all(torch.equal(g, p.grad) if p.grad is not None else True
                       for g, p in zip(grads, params))
        state.calls.append({
            "index": bucket.index(),
            "is_last": bucket.is_last(),
            "params": [state.names[id(p)] for p in params],
            "shapes": [list(g.shape) for g in grads],
            "numel": buf.numel(),
            "grads_alias_buffer": offsets_ok,
            "sum": buf.double().sum().item(),
            "grads_ok": grads_ok,
        })
        return allreduce_then_divide(None, bucket)


def one_bucket_at_a_time(hook):
    """torch's quantization hooks issue their second all_gather inside a
    future callback (a Gloo worker thread); with two buckets in flight the
    ranks may issue them in different orders. Finish each bucket before the
    next one (the same wrapper on both sides; the values do not depend on
    the overlap)."""
    def run(state, bucket):
        fut = hook(state, bucket)
        fut.wait()
        return fut
    return run


def cpu_quantization():
    """torch 1.13's quantization hooks are written for NCCL on CUDA: they
    call .cuda(tensor.device), and they read an all_gather future's value as
    NCCL's ([outputs stacked]) where Gloo's is the output list itself.
    Adapted here, identically for torch's DDP and gradd's: .cuda(cpu) is a
    no-op and the hooks' all_gather futures carry [outputs stacked]."""
    original = torch.Tensor.cuda

    def cuda(self, device=None, *args, **kwargs):
        if isinstance(device, torch.device) and device.type == "cpu":
            return self
        return original(self, device, *args, **kwargs)

    torch.Tensor.cuda = cuda

    class NcclShapedDist:
        def __getattr__(self, name):
            return getattr(dist, name)

        @staticmethod
        def all_gather(outputs, tensor, group=None, async_op=False):
            work = dist.all_gather(outputs, tensor, group=group, async_op=True)

            class Work:
                @staticmethod
                def get_future():
                    return work.get_future().then(lambda f: [torch.stack(outputs)])

            return Work()

    quantization_hooks.dist = NcclShapedDist()


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = models.mlp()
        self.spare = nn.Linear(10, 10)  # used on rank 0 at odd steps only

    def forward(self, x, use_spare):
        y = self.body(x)
        return self.spare(y) if use_spare else y


def main():
    hook, init_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank, world = init_gloo(init_file)
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(CAP_MB * (1 << 20))
    torch.manual_seed(1000 + rank)  # different initial weights per rank
    unused = hook == "unused_then"
    if unused:
        model, loss_fn = WithUnused(), nn.CrossEntropyLoss()

        def make_input(g):
            return torch.randn(16, 32, generator=g)
    else:
        model, make_input, loss_fn = models.build("mlp")
    static = hook == "static_then"
    ref = TorchDDP(copy.deepcopy(model), bucket_cap_mb=CAP_MB, find_unused_parameters=unused,
                   static_graph=static)
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB,
        find_unused_parameters=unused, static_graph=static,
    )

    recorders = []
    fused = hook == "fused_sgd"
    averager = {}
    seen = []
    states = []
    if hook in ("user_then", "unused_then", "static_then"):
        for ddp in (ref, ours):
            ddp.register_comm_hook(None, allreduce_then_divide)
    elif hook in ("group_none", "group_pg", "group_fallback"):
        if hook == "group_fallback":
            gradd.distributed._c10d = None  # as when gradd._c10d is not built
        ref.register_comm_hook(None if hook != "group_pg" else ref.process_group,
                               allreduce_then_divide)
        ours.register_comm_hook(None if hook != "group_pg" else ours.process_group,
                                recording(allreduce_then_divide, seen))
    elif hook == "powersgd_wrapped":
        for ddp in (ref, ours):
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                min_compression_rate=0.5, random_seed=7)
            states.append(state)
            # PowerSGD issues its P and Q allreduces from future callbacks:
            # with several buckets in flight the ranks' issue order would be
            # a race (over Gloo as over gradd); one bucket at a time.
            hook_fn = one_bucket_at_a_time(wrapped_powersgd)
            ddp.register_comm_hook(state, hook_fn if ddp is ref else recording(hook_fn, seen))
    elif hook == "noop":
        for ddp in (ref, ours):
            ddp.register_comm_hook(None, debugging_hooks.noop_hook)
    elif hook == "record":
        for ddp in (ref, ours):
            names = {id(p): n for n, p in ddp.module.named_parameters()}
            rec = Recorder(names)
            recorders.append(rec)
            ddp.register_comm_hook(rec, rec.hook)
    elif hook in ("quant_pertensor", "quant_perchannel"):
        cpu_quantization()
        fn = getattr(quantization_hooks, f"quantization_{hook[6:]}_hook")
        for ddp in (ref, ours):
            ddp.register_comm_hook(None, one_bucket_at_a_time(fn))
    elif hook.startswith("post_localsgd"):
        # Local SGD after START_LOCAL_SGD steps: each rank's subgroup is
        # itself (new_group must be called by every rank for every group).
        singles = [dist.new_group([r]) for r in range(world)]
        for ddp in (ref, ours):
            state = post_localSGD_hook.PostLocalSGDState(
                process_group=None, subgroup=singles[rank],
                start_localSGD_iter=START_LOCAL_SGD,
                post_local_gradient_allreduce=hook == "post_localsgd",
            )
            ddp.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
            averager[id(ddp)] = averagers.PeriodicModelAverager(
                period=2, warmup_steps=START_LOCAL_SGD)
    elif fused:
        # torch 1.13's DDP._register_fused_optim imports FSDP, which fails on
        # Python 3.11; the reference registers what it would register.
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.distributed.algorithms.ddp_comm_hooks.optimizer_overlap_hooks import (
            _hook_then_optimizer,
            _OptimizerHookState,
        )
        from torch.distributed.optim import as_functional_optim

        ref.register_comm_hook(None, _hook_then_optimizer(
            allreduce_hook, _OptimizerHookState(as_functional_optim(torch.optim.SGD, 0.05))))
        ours._register_fused_optim(torch.optim.SGD, 0.05)
    else:
        raise ValueError(hook)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05)

    per_step = []
    gloo = dist.distributed_c10d._get_default_group()
    gloo_ops = 0  # collectives gradd's steps issued on the Gloo group
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)  # each rank its own data
        x = make_input(g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        for ddp, opt in ((ref, opt_ref), (ours, opt_ours)):
            opt.zero_grad()
            before = gloo._get_sequence_number_for_group()
            out = ddp(x, rank == 0 and step % 2 == 1) if unused else ddp(x)
            loss_fn(out, y).backward()
            if ddp is ours:
                gloo_ops += gloo._get_sequence_number_for_group() - before
        grad_err = max(
            (rel_err(q.grad, p.grad) if p.grad is not None else float(q.grad is not None))
            for p, q in zip(ref.module.parameters(), ours.module.parameters())
        )
        if not fused:  # the fused optimizer stepped during backward
            opt_ref.step()
            opt_ours.step()
        for ddp in (ref, ours):
            if id(ddp) in averager:
                averager[id(ddp)].average_parameters(ddp.module.parameters())
        param_err = max(rel_err(q, p)
                        for p, q in zip(ref.module.parameters(), ours.module.parameters()))
        per_step.append([grad_err, param_err])

    flat = torch.cat([p.detach().reshape(-1).double() for p in ours.module.parameters()])
    hooks_job = None
    dist.barrier()  # both ranks still attached
    if rank == 0 and os.environ.get("GRADDCTL_BINARY"):
        hooks_job = graddctl_job(f"{ours.job_id}/trainer-hooks")
    dist.barrier()
    print(json.dumps({
        "rank": rank,
        "num_buckets": ours.num_buckets,
        "per_step": per_step,
        "param0": flat[:8].tolist(),
        "daemon_hook": ours._hooks.registered,
        "recorded": [r.calls for r in recorders],
        "pid": os.getpid(),
        "seen": seen,
        "gloo_ops": gloo_ops,
        "hooks_job": hooks_job,
        "states": [{"iter": st.iter, "process_group_is_none": st.process_group is None}
                   for st in states],
    }))
    ours.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    # torch 1.13's Gloo threads can still hold futures with Python callbacks
    # (torch's Reducer keeps the last iteration's); destroyed during
    # interpreter finalisation they abort the process ("terminate called
    # without an active exception"). Everything is reported: leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
