"""One rank of the communication-hook parity tests: trains the same model
with torch's DistributedDataParallel (Gloo) and gradd.torch side by side in
this process, the same hook registered on both, and after every step
compares gradients and parameters. Prints one JSON line.

Args: HOOK GLOO_INIT_FILE STEPS [POWERSGD_JSON]. HOOK: allreduce, fp16,
bf16, builtin_fp16, powerSGD, batched_powerSGD. POWERSGD_JSON: keyword
arguments of PowerSGDState. Rank/world from RANK/WORLD_SIZE..., daemon from
GRADD_SOCKET, job from GRADD_JOB, device from GRADD_TEST_DEVICE
(parity_util.test_device).
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
import models
from parity_util import device_ids, init_gloo, rel_err, test_device

CAP_MB = 0.01  # ~10 KB: several buckets for the MLP


def bf16_reference_hook(process_group, bucket):
    """torch's bf16_compress_hook, except that torch's Gloo cannot allreduce
    bfloat16: the bfloat16 values are summed in float32 and the sum rounded
    back to bfloat16 once (what the hook computes, up to bfloat16 rounding
    of the partial sums)."""
    world = dist.get_world_size()
    compressed = bucket.buffer().to(torch.bfloat16).div_(world).float()
    fut = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(fut):
        buf = bucket.buffer()
        buf.copy_(fut.value()[0].to(torch.bfloat16))
        return buf

    return fut.then(decompress)


def _orthogonalize_2d_too(orthogonalize):
    """torch 1.13's batched_powerSGD_hook hands _orthogonalize a 2-D matrix,
    which it asserts against (it expects a batch); the reference runs the
    hook with that one matrix treated as a batch of one."""
    def fixed(matrices, epsilon=0):
        if matrices.dim() == 2:
            return orthogonalize(matrices.unsqueeze(0), epsilon)
        return orthogonalize(matrices, epsilon)
    return fixed


def one_bucket_at_a_time(hook):
    """torch's PowerSGD hooks wait on allreduces inside future callbacks,
    which run on Gloo's worker threads; with two buckets in flight those
    callbacks deadlock the workers or issue collectives in a different
    order on each rank. The reference therefore finishes each bucket before
    DDP hands it the next (the results do not depend on the overlap)."""
    def run(state, bucket):
        fut = hook(state, bucket)
        fut.wait()
        return fut
    return run


def register(hook, ref, ours, psgd):
    if hook == "allreduce":
        ref.register_comm_hook(None, default_hooks.allreduce_hook)
        ours.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "fp16":
        ref.register_comm_hook(None, default_hooks.fp16_compress_hook)
        ours.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "builtin_fp16":
        ref._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
        ours._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif hook == "bf16":
        # torch refuses bf16_compress_hook without CUDA/NCCL at registration;
        # the reference goes around that check, gradd takes torch's hook.
        dist._register_comm_hook(ref.reducer, None, bf16_reference_hook)
        ours.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook in ("powerSGD", "batched_powerSGD"):
        fn = getattr(powerSGD_hook, hook + "_hook")
        if hook == "batched_powerSGD":
            powerSGD_hook._orthogonalize = _orthogonalize_2d_too(powerSGD_hook._orthogonalize)
        # Registered directly: DDP's signature check does not know the wrapper.
        dist._register_comm_hook(ref.reducer, powerSGD_hook.PowerSGDState(None, **psgd),
                                 one_bucket_at_a_time(fn))
        ours.register_comm_hook(powerSGD_hook.PowerSGDState(None, **psgd), fn)
    else:
        raise ValueError(hook)


def main():
    hook, init_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    psgd = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    rank, world = init_gloo(init_file)

    # The same buckets on both sides (PowerSGD's state is per bucket): torch
    # reads its first-bucket cap from this module constant at construction.
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(CAP_MB * (1 << 20))
    torch.manual_seed(1000 + rank)  # different initial weights per rank
    model, make_input, loss_fn = models.build("mlp")
    dev = test_device()
    model = model.to(dev)
    ref = TorchDDP(copy.deepcopy(model), device_ids=device_ids(dev), bucket_cap_mb=CAP_MB)
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), device_ids=device_ids(dev), bucket_cap_mb=CAP_MB,
        first_bucket_cap_mb=CAP_MB
    )
    register(hook, ref, ours, psgd)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05)

    per_step = []
    grads_16bit = True
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)  # each rank its own data
        x = make_input(g).to(dev)
        y = torch.randint(0, 10, (x.shape[0],), generator=g).to(dev)
        for ddp, opt in ((ref, opt_ref), (ours, opt_ours)):
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
        # Errors relative to the largest gradient any single rank had for the
        # tensor: the 16-bit hooks round each rank's contribution (torch) or
        # the node's sum (gradd), so where the ranks' gradients cancel the
        # error is that of the parts, not of the small average.
        local = copy.deepcopy(ref.module)
        local_grads = torch.autograd.grad(loss_fn(local(x), y), list(local.parameters()))
        scales = torch.tensor([lg.abs().max().item() for lg in local_grads],
                              dtype=torch.float64, device=dev)
        dist.all_reduce(scales, op=dist.ReduceOp.MAX)
        grad_err = max(
            (q.grad.double() - p.grad.double()).abs().max().item() / max(s.item(), 1e-30)
            for p, q, s in zip(ref.module.parameters(), ours.module.parameters(), scales)
        )
        wire = {"fp16": torch.float16, "builtin_fp16": torch.float16, "bf16": torch.bfloat16}
        if hook in wire:
            grads_16bit &= all(
                torch.equal(q.grad, q.grad.to(wire[hook]).float()) for q in ours.module.parameters()
            )
        opt_ref.step()
        opt_ours.step()
        param_err = max(rel_err(q, p)
                        for p, q in zip(ref.module.parameters(), ours.module.parameters()))
        per_step.append([grad_err, param_err])
        if hook != "allreduce":
            # Lossy hooks: start every step from the same parameters, so each
            # step measures one application of the hook rather than the drift
            # of two trajectories that rounded differently before.
            with torch.no_grad():
                for p, q in zip(ref.module.parameters(), ours.module.parameters()):
                    q.copy_(p)

    flat = torch.cat([p.detach().reshape(-1).double() for p in ours.module.parameters()])
    print(json.dumps({
        "rank": rank,
        "num_buckets": ours.num_buckets,
        "per_step": per_step,
        "grads_16bit": grads_16bit,
        "param0": flat[:8].tolist(),
        "grads_on_device": all(q.grad.device == dev for q in ours.module.parameters()),
    }))
    ours.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
