"""Sparse gradients (``nn.Embedding(sparse=True)``, ``nn.EmbeddingBag(sparse=True)``)
for gradd.torch.DistributedDataParallel.

torch's DDP gives each parameter of such a module its own bucket and, with
the Gloo backend, reduces it with Gloo's sparse allreduce: every rank divides
its (uncoalesced) gradient by the world size, coalesces it, all ranks gather
every rank's indices and values, sum the sparse tensors in rank order and
coalesce the sum. The parameter's ``.grad`` becomes that sparse tensor, so
``torch.optim.SparseAdam`` (or SGD without momentum) works as with torch.

gradd does the same, with the daemon's broadcast as the transport (it crosses
nodes as well), once per synchronised backward, after the dense buckets:

  1. sizes: every rank in turn broadcasts the nnz of each of its sparse
     gradients (``world`` broadcasts of a few bytes), so every rank knows the
     byte count of every payload;
  2. payloads: every rank in turn broadcasts its coalesced indices (int64)
     and values for all sparse parameters, packed, in chunks of the
     attach's broadcast area;
  3. every rank sums the gathered tensors in rank order and coalesces.

Dense buckets never hold sparse parameters: they are left out of the
registration with the daemon (an embedding's dense bucket would cost its
full size in shared memory on every rank for a gradient that touches a few
rows). A sparse parameter that no rank used keeps its ``.grad`` (None stays
None); one used by some ranks gets the average on every rank, the ranks that
did not use it counting as zeros.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch

_INDEX_DTYPE = torch.int64


def sparse_parameter_ids(module: torch.nn.Module) -> set:
    """ids of the parameters torch DDP expects sparse gradients for (the
    weights of Embedding/EmbeddingBag modules built with sparse=True)."""
    out = set()
    for m in module.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            for p in m.parameters(recurse=False):
                out.add(id(p))
    return out


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


class SparseReducer:
    """Averages the sparse gradients of one DDP model across the job.

    ``broadcast(buf, root)`` overwrites the uint8 tensor ``buf`` with global
    rank ``root``'s bytes on every rank (every rank calls it in the same
    order); it is the DDP wrapper's chunked daemon broadcast.
    """

    def __init__(
        self,
        names: Sequence[str],
        params: Sequence[torch.nn.Parameter],
        rank: int,
        world_size: int,
        broadcast: Callable[[torch.Tensor, int], None],
    ):
        self.names = list(names)
        self.params = list(params)
        self.rank = rank
        self.world_size = world_size
        self._broadcast = broadcast
        for n, p in zip(self.names, self.params):
            if not p.dtype.is_floating_point:
                raise TypeError(f"sparse parameter '{n}' has dtype {p.dtype}")

    def __len__(self) -> int:
        return len(self.params)

    def _local(self, p: torch.nn.Parameter) -> Optional[torch.Tensor]:
        g = p.grad
        if g is None:
            return None
        if not g.is_sparse:
            raise RuntimeError(
                "gradd: expected a sparse gradient for a parameter of a sparse "
                f"Embedding, got a {g.layout} one"
            )
        # torch divides the rank's gradient before its allreduce, then the
        # allreduce coalesces: same order of rounding here.
        return (g / self.world_size).coalesce()

    def reduce(self) -> None:
        """Replaces every sparse parameter's .grad by the job-wide average."""
        if not self.params or self.world_size == 1:
            for p in self.params:
                if p.grad is not None and p.grad.is_sparse:
                    p.grad = (p.grad / self.world_size).coalesce()
            return
        local = [self._local(p) for p in self.params]
        nnz = torch.tensor(
            [-1 if g is None else g._nnz() for g in local], dtype=torch.int64
        )
        # 1. sizes of every rank's gradients (-1: no gradient on that rank).
        sizes: List[torch.Tensor] = []
        for root in range(self.world_size):
            buf = nnz.clone() if root == self.rank else torch.empty_like(nnz)
            self._broadcast(_as_bytes(buf), root)
            sizes.append(buf)
        # 2. every rank's indices and values.
        gathered: List[List[Optional[Tuple[torch.Tensor, torch.Tensor]]]] = []
        for root in range(self.world_size):
            layout = [self._layout(i, int(sizes[root][i])) for i in range(len(self.params))]
            total = sum(ib + vb for _, _, ib, vb in layout)
            if total == 0:
                gathered.append([None if int(sizes[root][i]) < 0 else self._empty(i)
                                 for i in range(len(self.params))])
                continue
            if root == self.rank:
                parts = []
                for g in local:
                    if g is not None and g._nnz() > 0:
                        parts.append(_as_bytes(g.indices().to(_INDEX_DTYPE)))
                        parts.append(_as_bytes(g.values()))
                buf = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
            else:
                buf = torch.empty(total, dtype=torch.uint8)
            self._broadcast(buf, root)
            gathered.append(self._unpack(buf, layout, sizes[root]))
        # 3. sum in rank order, as Gloo's sparse allreduce does.
        with torch.no_grad():
            for i, p in enumerate(self.params):
                parts = [g[i] for g in gathered if g[i] is not None]
                if not parts:
                    continue  # nobody used it: .grad stays as it is
                out = torch.sparse_coo_tensor(parts[0][0], parts[0][1], p.shape,
                                              dtype=p.dtype)
                for idx, val in parts[1:]:
                    out = out + torch.sparse_coo_tensor(idx, val, p.shape, dtype=p.dtype)
                p.grad = out.coalesce()

    # -- packing ------------------------------------------------------------
    def _dense_shape(self, i: int) -> Tuple[int, ...]:
        # Embedding gradients are sparse in the first dimension only.
        return tuple(self.params[i].shape[1:])

    def _layout(self, i: int, nnz: int):
        p = self.params[i]
        if nnz <= 0:
            return (i, nnz, 0, 0)
        row = 1
        for d in self._dense_shape(i):
            row *= d
        return (i, nnz, nnz * 8, nnz * row * p.element_size())

    def _empty(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        p = self.params[i]
        return (torch.empty((1, 0), dtype=_INDEX_DTYPE),
                torch.empty((0,) + self._dense_shape(i), dtype=p.dtype))

    def _unpack(self, buf: torch.Tensor, layout, sizes: torch.Tensor):
        out = []
        at = 0
        for i, nnz, ib, vb in layout:
            if nnz < 0:
                out.append(None)
                continue
            if nnz == 0:
                out.append(self._empty(i))
                continue
            p = self.params[i]
            idx = buf[at:at + ib].clone().view(_INDEX_DTYPE).view(1, nnz)
            at += ib
            val = buf[at:at + vb].clone().view(p.dtype).view((nnz,) + self._dense_shape(i))
            at += vb
            out.append((idx, val))
        return out
