"""Job ids for several DistributedDataParallel models in one process.

torch gives every DDP model its own reducer on a shared process group; gradd
gives every model its own daemon job. All ranks construct their models in the
same order (torch requires the same of process-group creation), so a
per-rank construction counter names the n-th model of a base job id
``<base>/<n>`` identically on every rank, with no configuration. The first
model keeps the base id unchanged (what single-model jobs always used).

The counter is keyed by (base id, global rank), not just per process, so that
tests running several ranks as threads of one process derive the same ids as
one-rank-per-process jobs.

Ids that the ranks draw together (through torch's process group or
torchrun's agent store) need no counter: see gradd/_world.py.
"""
from __future__ import annotations

import threading
from typing import Dict, Tuple

_lock = threading.Lock()
_constructed: Dict[Tuple[str, int], int] = {}


def next_model_index(base: str, rank: int) -> int:
    """0 for the first model this rank constructs on `base`, then 1, 2, ..."""
    with _lock:
        n = _constructed.get((base, rank), 0)
        _constructed[(base, rank)] = n + 1
    return n


def derive_job_id(base: str, rank: int) -> str:
    """The job id of the next model this rank constructs on `base`."""
    n = next_model_index(base, rank)
    return base if n == 0 else f"{base}/{n}"
