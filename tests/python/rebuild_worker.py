"""One rank of the bucket-rebuild parity test (test_rebuild.py): trains a
model whose modules are registered in another order than forward uses them
with torch's DDP (Gloo) and gradd.torch's side by side, compares gradients
and parameters after every step, and reports when each rebuilt its buckets
and what the buckets look like afterwards. Prints one JSON line.

Args: MODE GLOO_INIT_FILE STEPS [ZERO_GRAD], MODE one of plain / static /
unused; ZERO_GRAD default (zero_grad() as called: set_to_none=False in torch
1.13, True in 2.x), none (.grad is None when the rebuild happens) or zero
(every .grad is a zeroed bucket view that moves).
Rank/world from RANK/WORLD_SIZE/LOCAL_*; daemon from GRADD_SOCKET, job from
GRADD_JOB (multi-node: GRADD_COORDINATOR); device from GRADD_TEST_DEVICE
(parity_util.test_device: cuda for the GPU tests, test_cuda_ddp.py).
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
from gradd import _ddp_logging
from parity_util import device_ids, init_gloo, rel_err, test_device

FIRST_CAP_BYTES = 2000
CAP_MB = 0.004  # 4194 bytes


class Shuffled(nn.Module):
    """Registered head, mid, embed; used embed, mid, head: the gradients
    become ready in another order than reverse registration."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(32, 10)
        self.mid = nn.Linear(48, 32)
        self.embed = nn.Linear(20, 48)

    def forward(self, x):
        return self.head(torch.relu(self.mid(torch.relu(self.embed(x)))))


def main():
    mode, init_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    zero_grad = {"default": {}, "none": {"set_to_none": True}, "zero": {"set_to_none": False}}[
        sys.argv[4] if len(sys.argv) > 4 else "default"
    ]
    rank, world = init_gloo(init_file)
    dev = test_device()
    # torch's first bucket cap is this module attribute (read by DDP's
    # constructor); gradd's is first_bucket_cap_mb.
    dist._DEFAULT_FIRST_BUCKET_BYTES = FIRST_CAP_BYTES
    kwargs = dict(
        bucket_cap_mb=CAP_MB,
        static_graph=mode == "static",
        find_unused_parameters=mode == "unused",
        device_ids=device_ids(dev),
    )
    torch.manual_seed(1000 + rank)  # different initial weights on each rank
    model = Shuffled().to(dev)
    ref = TorchDDP(copy.deepcopy(model), **kwargs)
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), first_bucket_cap_mb=FIRST_CAP_BYTES / (1 << 20), **kwargs
    )
    initial_plan = [b["params"] for b in ours.bucket_info()]
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)

    per_step, rebuilt = [], []
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)  # each rank its own data
        x = torch.randn(8, 20, generator=g).to(dev)
        y = torch.randint(0, 10, (8,), generator=g).to(dev)
        for ddp, opt in ((ref, opt_ref), (ours, opt_ours)):
            opt.zero_grad(**zero_grad)
            nn.functional.cross_entropy(ddp(x), y).backward()
        rebuilt.append([bool(ref._has_rebuilt_buckets), bool(ours._has_rebuilt_buckets)])
        err = 0.0
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            err = max(err, rel_err(q.grad, p.grad))
        opt_ref.step()
        opt_ours.step()
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            err = max(err, rel_err(q, p))
        per_step.append(err)

    torch_log = ref._get_ddp_logging_data()
    info = ours.bucket_info()
    print(json.dumps({
        "rank": rank,
        "per_step": per_step,
        "rebuilt": rebuilt,
        "initial_plan": initial_plan,
        # In torch's terms: the user's parameters only (gradd's buckets also
        # hold its hidden used map; a bucket of only the map is dropped).
        "ours_sizes": _ddp_logging.bucket_sizes(ours.client, ours._params),
        "ours_params": [b["params"] for b in info if b["params"]],
        "torch_sizes": torch_log.get("rebuilt_bucket_sizes"),
        "torch_params": torch_log.get("rebuilt_per_bucket_param_indices"),
        "client_rebuilt": ours.client.has_rebuilt_buckets,
        "torch_log": {k: torch_log.get(k) for k in ("has_rebuilt_buckets", "rebuilt_bucket_sizes",
                                                     "rebuilt_per_bucket_param_indices")},
        "ours_log": _ddp_logging.rebuild_fields(ours.client, ours._params),
        "grads_on_device": all(p.grad is not None and p.grad.device == dev for p in ours.module.parameters()),
        "grads_in_shared_memory": all(
            p.grad is not None and p.grad.data_ptr() == ours.client.gradient_address(i)
            for i, p in enumerate(ours.module.parameters())
        ),
        "checksum": torch.cat([p.detach().reshape(-1) for p in ours.module.parameters()]).double().sum().item(),
    }))
    ours.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
