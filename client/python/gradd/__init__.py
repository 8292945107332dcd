"""gradd: the Python client of the gradd gradient aggregation daemon.

Low level (no torch needed)::

    import gradd
    c = gradd.attach([("w", (1024,), "float32")], job_id="j",
                     local_rank=r, local_world_size=2)
    g = c.gradient(0)          # numpy view into shared bucket memory
    g[:] = ...                 # write the gradient (no copy to the daemon)
    c.mark_ready(0)            # the bucket goes to the daemon when complete
    c.wait_all()               # g now holds the average over all ranks

PyTorch: ``gradd.torch.DistributedDataParallel`` is a drop-in for
``torch.nn.parallel.DistributedDataParallel``.

Errors from the client library or the daemon raise ``gradd.GraddError`` (a
``RuntimeError``) or its subclass for the status code (e.g.
``gradd.FailedPreconditionError``); ``err.code`` is the code's name.
``gradd.IterationAbortedError`` (an ``AbortedError``) is the one error a
job goes on after: a rank restarted (rank_restart_grace_ms > 0), the
iteration was applied by nobody; skip the optimizer step and retry the batch.
"""
from __future__ import annotations

from gradd._C import (  # noqa: F401  (re-exported)
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    Client,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    GraddError,
    InternalError,
    InvalidArgumentError,
    IterationAbortedError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
    attach,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "GraddError",
    "attach",
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "IterationAbortedError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
]
