"""One rank of the join (uneven inputs) parity test.

Phase 1 trains with torch's DistributedDataParallel + torch's join (Gloo) and
records gradients and parameters after every step, buffers and the final
model; then torch.distributed is torn down (gradd needs no process group) and
phase 2 trains the same model, seed and per-rank data with
gradd.torch.DistributedDataParallel under join and compares with the record.
Rank r gets 3 + 2r batches (or 3 each with enable=0). Prints one JSON line.

Args: MODEL GLOO_INIT_FILE API DIVIDE THROW ENABLE
  API: "method" (model.join(...)) or "generic" (torch's Join([model], ...)).
Device from GRADD_TEST_DEVICE (parity_util.test_device).
"""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
import models
from parity_util import device_ids, rel_err, test_device

CAP_MB = 0.002  # several buckets even for the small models


def model_err(ours, want):
    """Largest difference over a list of tensors relative to the largest
    magnitude in the list: gradients that are rounding noise (a conv bias
    before BatchNorm) would make per-tensor ratios meaningless, and torch
    divides before summing while gradd sums first (equal up to rounding
    when the world size is not a power of two)."""
    diff = max((a.detach().double() - b.detach().double()).abs().max().item() for a, b in zip(ours, want))
    scale = max(b.detach().double().abs().max().item() for b in want)
    return diff / scale if scale > 0 else diff


def context(ddp, api, divide, throw, enable):
    if api == "method":
        return ddp.join(
            divide_by_initial_world_size=divide, enable=enable, throw_on_early_termination=throw
        )
    return Join(
        [ddp], enable=enable, throw_on_early_termination=throw, divide_by_initial_world_size=divide
    )


def comparer(record, per_step):
    """on_step for `train`: each step's gradients, parameters and buffers
    against `record[step]` (torch's), the error appended to `per_step`
    (inf for a step torch did not run)."""
    def compare(step, grads, ddp):
        want_g, want_p, want_b = record[step] if step < len(record) else (None, None, None)
        if want_g is None:
            per_step.append(float("inf"))
            return
        err = max(model_err(grads, want_g), model_err(list(ddp.module.parameters()), want_p))
        if want_b:
            err = max(err, max(rel_err(a, b) for a, b in zip(ddp.module.buffers(), want_b)))
        per_step.append(err)
    return compare


def train(ddp, make_input, loss_fn, batches, rank, api, divide, throw, enable, on_step):
    """Runs the loop under join; returns (steps done, error text or None)."""
    dev = test_device()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    done = 0
    try:
        with context(ddp, api, divide, throw, enable):
            for step in range(batches):
                g = torch.Generator().manual_seed(step * 100 + rank)
                x = make_input(g).to(dev)
                y = torch.randint(0, 10, (x.shape[0],), generator=g).to(dev)
                opt.zero_grad()
                loss_fn(ddp(x), y).backward()
                grads = [p.grad.detach().clone() for p in ddp.module.parameters()]
                opt.step()
                on_step(step, grads, ddp)
                done += 1
    except RuntimeError as e:
        return done, str(e)
    return done, None


def main():
    name, init_file, api = sys.argv[1], sys.argv[2], sys.argv[3]
    divide, throw, enable = (bool(int(v)) for v in sys.argv[4:7])
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    batches = 3 + 2 * rank if enable else 3

    torch.manual_seed(1000 + rank)  # different initial weights per rank
    model, make_input, loss_fn = models.build(name)
    dev = test_device()
    model = model.to(dev)

    # -- phase 1: torch --------------------------------------------------
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ref = TorchDDP(copy.deepcopy(model), device_ids=device_ids(dev), bucket_cap_mb=CAP_MB)
    record = []

    def keep(step, grads, ddp):
        record.append(
            (grads, [p.detach().clone() for p in ddp.module.parameters()],
             [b.detach().clone() for b in ddp.module.buffers()])
        )

    ref_steps, ref_error = train(ref, make_input, loss_fn, batches, rank, api, divide, throw, enable, keep)
    ref_final = [t.detach().clone() for t in ref.module.state_dict().values()]
    dist.barrier()
    dist.destroy_process_group()

    # -- phase 2: gradd, no torch process group ---------------------------
    assert not dist.is_initialized()
    from torch.distributed.algorithms.join import Joinable
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), device_ids=device_ids(dev), bucket_cap_mb=CAP_MB,
        first_bucket_cap_mb=CAP_MB
    )
    assert isinstance(ours, Joinable)
    per_step = []
    our_steps, our_error = train(ours, make_input, loss_fn, batches, rank, api, divide, throw,
                                 enable, comparer(record, per_step))
    final_err = max(
        rel_err(a, b) for a, b in zip(ours.module.state_dict().values(), ref_final)
    )
    flat = torch.cat([p.detach().reshape(-1).double() for p in ours.module.parameters()])
    print(json.dumps({
        "rank": rank,
        "batches": batches,
        "steps": [ref_steps, our_steps],
        "errors": [ref_error, our_error],
        "per_step": per_step,
        "final_err": final_err,
        "num_buckets": ours.num_buckets,
        "in_join_after": ours.client.in_join,
        "authoritative": getattr(ours, "_authoritative_rank", None),
        "checksum": flat.sum().item(),
        "grads_on_device": all(p.grad is None or p.grad.device == dev
                               for p in ours.module.parameters()),
    }))
    ours.shutdown()


if __name__ == "__main__":
    main()
