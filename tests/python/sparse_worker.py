"""One rank of the sparse-gradient parity test: an Embedding(sparse=True)
plus dense layers, trained with torch's DDP (Gloo) and with
gradd.torch.DistributedDataParallel side by side in this process; after every
step the gradients (sparse ones compared densified, and checked to be
sparse) and parameters are compared. Prints one JSON line.

Args: GLOO_INIT_FILE STEPS. Rank/world from RANK/WORLD_SIZE, the daemon from
GRADD_SOCKET / GRADD_JOB (and LOCAL_*/GROUP_RANK for several nodes).
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
from parity_util import init_gloo, rel_err

VOCAB, DIM = 40, 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, sparse=True)
        self.bag = nn.EmbeddingBag(VOCAB, DIM, mode="sum", sparse=True)
        self.fc = nn.Linear(2 * DIM, 3)

    def forward(self, ids):
        return self.fc(torch.cat([self.emb(ids).mean(1), self.bag(ids)], 1))


def optimizers(model):
    sparse = [model.module.emb.weight, model.module.bag.weight]
    dense = list(model.module.fc.parameters())
    return [torch.optim.SparseAdam(sparse, lr=0.05),
            torch.optim.SGD(dense, lr=0.1, momentum=0.9)]


def main():
    init_file, steps = sys.argv[1], int(sys.argv[2])
    rank, world = init_gloo(init_file)
    torch.manual_seed(500 + rank)  # different initial weights on every rank
    model = Model()
    ref = TorchDDP(copy.deepcopy(model))
    ours = gradd.torch.DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=0.001,
                                               first_bucket_cap_mb=0.001)
    opts = {id(ref): optimizers(ref), id(ours): optimizers(ours)}
    worst, per_step, sparse_ok, differs = 0.0, [], True, False
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 31 + rank)
        # Rank-dependent vocabulary slices that overlap, with repeated ids.
        lo = (rank * 7 + step) % (VOCAB - 12)
        ids = torch.randint(lo, lo + 12, (5, 4), generator=g)
        y = torch.randint(0, 3, (5,), generator=g)
        for ddp in (ref, ours):
            for o in opts[id(ddp)]:
                # Both ways of clearing: a fresh sparse grad, or one that
                # autograd accumulates into.
                o.zero_grad(set_to_none=step % 2 == 0)
            if step == 3:  # a local accumulation step first
                with ddp.no_sync():
                    nn.functional.cross_entropy(ddp(ids.flip(0)), y).backward()
            nn.functional.cross_entropy(ddp(ids), y).backward()
        if step == 0:
            local = copy.deepcopy(ours.module)
            for p in local.parameters():
                p.grad = None
            nn.functional.cross_entropy(local(ids), y).backward()
            differs = rel_err(local.emb.weight.grad, ours.module.emb.weight.grad) > 1e-3
        err = 0.0
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            sparse_ok &= (p.grad.is_sparse == q.grad.is_sparse)
            err = max(err, rel_err(q.grad, p.grad))
        for ddp in (ref, ours):
            for o in opts[id(ddp)]:
                o.step()
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            err = max(err, rel_err(q, p))
        per_step.append(err)
        worst = max(worst, err)
    checksum = float(sum(p.double().sum() for p in ours.module.parameters()))
    ours.shutdown()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "per_step": per_step, "worst": worst,
                      "sparse_ok": sparse_ok, "grads_differ_locally": differs,
                      "checksum": checksum}))


if __name__ == "__main__":
    main()
