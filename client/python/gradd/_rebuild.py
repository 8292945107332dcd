"""Bucket rebuild for gradd.torch.DistributedDataParallel.

torch's DDP re-plans its buckets once, from the order in which gradients
actually became ready (``Reducer::rebuild_buckets``): at the start of the
forward after the first synced iteration (after the second with
``static_graph``, whose first iteration reduces everything at the end of
backward), only when ``static_graph`` or not ``find_unused_parameters``.
gradd does the same at the same point: the client library has recorded the
order in which the hooks marked parameters ready; ``rebuild_buckets()`` sends
it to the daemon, which plans from local rank 0's order (node rank 0's across
nodes, as torch broadcasts rank 0's) and switches every rank at once. The
client moves every gradient to its new place in the shared memory; here
``p.grad`` is re-pointed at the new view, as torch's
``initialize_bucket_views`` does with ``gradient_as_bucket_view``: a grad that
was the old view becomes the new view (same contents); a grad that is some
other tensor is copied into the new view first; a grad that is None stays
None.

CUDA modules rebuild exactly like CPU ones, as torch's DDP does: the new plan
lies in the same device memory, the client library moves every gradient
there (it waits for the daemon's last reduce and for this process's work on
the GPU first, then copies through host memory: once per job, between
iterations), and the new views are tensors over the new device addresses
(gradd/_cuda.py). A grad copied in from another tensor is copied on the
current stream, ahead of the next backward's kernels.

Every rank must take part; gradd fails the job (naming the rank) when one
does not, rather than hang.

What ``_get_ddp_logging_data()`` reports about a rebuild lives in
gradd/_ddp_logging.py (from the client's plan; nothing here imports it).
"""
from __future__ import annotations

from typing import Callable, List

import torch

from gradd import _cuda
from gradd._C import GraddError
from gradd._reducer import _is_view


def gradient_view(client, i: int, p: torch.Tensor) -> torch.Tensor:
    """Parameter i's gradient view into the client's bucket memory (CPU or
    the GPU `p` lives on)."""
    if p.device.type == "cuda":
        return _cuda.gradient_view(client, i, p)
    view = torch.from_numpy(client.gradient(i))
    if p.dtype == torch.bfloat16:
        view = view.view(torch.bfloat16)
    return view.view(p.shape)


class BucketRebuild:
    """One attach's bucket rebuild (module doc). The DDP gives it the
    client, the parameters, the reducer's gradient views (the list the
    reducer reads; re-pointed in place) and its ``fail``; it owns whether
    rebuilding is still allowed (``enabled``: off for jobs that survive a
    rank restart or a node loss, and once a communication hook runs in the
    trainer). Runs on the trainer's main thread, at a forward."""

    def __init__(self, client, params: List[torch.nn.Parameter], views: List[torch.Tensor],
                 fail: Callable[[BaseException], None], *, enabled: bool):
        self._client = client
        self._params = params
        self._views = views
        self._fail = fail
        self.enabled = bool(enabled)

    def due(self, *, find_unused_parameters: bool, static_graph: bool) -> bool:
        """Whether torch's forward would rebuild the buckets now."""
        client = self._client
        if not self.enabled:
            return False
        if client.has_rebuilt_buckets:
            # Autotune (bucket_cap_mb="auto"): the daemon named the
            # iteration after which every rank re-plans again.
            switch = client.next_plan_switch
            return switch != 0 and client.iteration - 1 == switch
        if find_unused_parameters and not static_graph:
            return False
        completed = client.iteration - 1  # synced iterations waited for
        return completed >= (2 if static_graph else 1)

    def maybe_rebuild(self, *, find_unused_parameters: bool, static_graph: bool) -> bool:
        """Rebuilds the buckets if torch would at this forward (grad
        enabled); returns whether it did."""
        if not self.due(find_unused_parameters=find_unused_parameters,
                        static_graph=static_graph):
            return False
        try:
            rebuilt = self._client.rebuild_buckets()
        except GraddError as e:
            self._fail(e)
        if rebuilt:
            self._repoint_views()
        return rebuilt

    def _repoint_views(self) -> None:
        """Points the reducer's views (and every p.grad that was a view) at
        the new places."""
        views = self._views
        with torch.no_grad():
            for i, p in enumerate(self._params):
                old, new = views[i], gradient_view(self._client, i, p)
                g = p.grad
                if g is not None:
                    if not _is_view(g, old):
                        new.copy_(g)
                    p.grad = new
                views[i] = new
