"""One rank of the join-with-a-trainer-side-hook parity test
(gradd/_trainer_join.py).

Phase 1 trains with torch's DistributedDataParallel + join (Gloo) and a user
allreduce hook (state None: torch's default group) and records gradients,
parameters and buffers after every step and the final model; phase 2 trains
the same model, seed and per-rank data with gradd.torch under join with the
same hook, and compares with the record. The Gloo group stays up in phase 2:
PATH "gradd" lets gradd hand the hook the job's gradd group (then gradd's
whole join -- join steps, shadowed hooks -- must issue no collective on the
Gloo group), PATH "fallback" hides gradd._c10d so the hook and the join steps
run over the Gloo group. Prints one JSON line.

Args: MODEL GLOO_INIT_FILE API THROW PATH BATCHES
  API: "method" (model.join(...)) or "generic" (torch's Join([model])).
  BATCHES: batches per rank, comma-separated (e.g. 3,5).
"""
import copy
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.distributed
import gradd.torch
import models
from join_worker import comparer, train
from parity_util import init_gloo, rel_err
from user_hook_worker import allreduce_then_divide

CAP_MB = 0.002  # several buckets even for the small models


def main():
    name, init_file, api = sys.argv[1], sys.argv[2], sys.argv[3]
    throw, path = bool(int(sys.argv[4])), sys.argv[5]
    rank, world = init_gloo(init_file)
    batches = [int(b) for b in sys.argv[6].split(",")][rank]
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(CAP_MB * (1 << 20))
    torch.manual_seed(1000 + rank)  # different initial weights per rank
    model, make_input, loss_fn = models.build(name)

    # -- phase 1: torch --------------------------------------------------
    ref = TorchDDP(copy.deepcopy(model), bucket_cap_mb=CAP_MB)
    ref.register_comm_hook(None, allreduce_then_divide)
    record = []

    def keep(step, grads, ddp):
        record.append(
            (grads, [p.detach().clone() for p in ddp.module.parameters()],
             [b.detach().clone() for b in ddp.module.buffers()])
        )

    ref_steps, ref_error = train(ref, make_input, loss_fn, batches, rank, api, True, throw, True,
                                 keep)
    ref_final = [t.detach().clone() for t in ref.module.state_dict().values()]
    dist.barrier()

    # -- phase 2: gradd ----------------------------------------------------
    if path == "fallback":
        gradd.distributed._c10d = None  # as when gradd._c10d is not built
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB)
    ours.register_comm_hook(None, allreduce_then_divide)
    per_step = []
    gloo = dist.distributed_c10d._get_default_group()
    before = gloo._get_sequence_number_for_group()
    our_steps, our_error = train(ours, make_input, loss_fn, batches, rank, api, True, throw, True,
                                 comparer(record, per_step))
    gloo_ops = gloo._get_sequence_number_for_group() - before
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
        "hook": ours._hooks.registered,
        "join_enabled_after": ours._join_config.enable,
        "authoritative": getattr(ours, "_authoritative_rank", None),
        "checksum": flat.sum().item(),
        "gloo_ops": gloo_ops,
    }))
    ours.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # see user_hook_worker.py: torch's Gloo futures at exit


if __name__ == "__main__":
    main()
