"""The job's own gradd collectives for the communication hooks that run in
the trainer (gradd/_trainer_hooks.py).

What it owns: one ``ProcessGroupGradd`` (the torch.distributed backend
"gradd", gradd/distributed.py) per DDP model whose hook runs in the trainer,
over exactly the DDP's ranks: a collective-only client of the job
``<DDP job id>/trainer-hooks`` on the same node layout as the DDP's own job,
attached at its first use (the first collective of the first backward, or of
the first join step; attaching waits for the other ranks as a first
collective does, nothing else is exchanged: the job id is derived from the
DDP's). It runs on the thread that runs autograd for the model; the group hooks
get (:class:`HookProcessGroup`) completes its futures on a pool of threads
of its own, so that a callback may wait for a collective it issues.

Which state the hook gets (torch's convention: a hook's state is the
process group, None meaning the default group; stateful hooks keep theirs
in ``state.process_group``):

* a state that means the DDP's ranks -- None when the DDP's group is the
  default one (or the launcher's world without torch.distributed), the
  DDP's own ``process_group``, torch's default group / ``dist.group.WORLD``
  for such a DDP -- becomes the job's gradd group. Same ranks, same rank
  numbers, so the hook computes what it computes over the user's group.
* a state object whose ``process_group`` is one of those (``PowerSGDState``,
  ``PostLocalSGDState``, ...): a view of the user's object (``_StateView``)
  whose ``process_group`` reads as the gradd group while the user's
  attribute still holds the group it replaces; every other read and every
  write go to the user's object, which is never changed by gradd (the
  hook's own writes, e.g. ``state.iter += 1``, land there as with torch).
  ``PostLocalSGDState.subgroup`` is other ranks and stays the user's.
* anything else (another group, a subgroup's DDP with state None, which
  torch's hooks read as the whole world): unchanged.

It is not used (the user's groups then, as torch) when gradd._c10d is not
built, for CUDA modules (the backend takes CPU tensors), or when the job's
ranks are numbered differently from the group's (group ranks interleaved
across nodes): :func:`unusable_reason` says why, and the registration logs
which path a hook takes, once, at INFO on the logger ``gradd.torch``.

While it is alive the group is entered in torch's group tables (when
torch.distributed is initialized) with the ranks of the group it stands
for, so ``dist.get_rank(state)``, ``dist.get_process_group_ranks(state)``
and ``dist.get_backend(state)`` (``"gradd"``) answer inside a hook;
``close()`` removes it.
"""
from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist

__all__ = ["HookProcessGroup", "JobGroup", "describe", "hook_state", "resolve",
           "stands_for_job", "unusable_reason"]

SUFFIX = "trainer-hooks"


def _dist():
    return dist if dist.is_available() else None


def _default_group():
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_group()


def unusable_reason(world, device: torch.device) -> Optional[str]:
    """Why the job's gradd group cannot stand in for the DDP's group (None:
    it can): `world` is the DDP's placement (a gradd._world.World), `device`
    its module's. The same answer on every rank of the job."""
    from gradd import distributed

    if not distributed.available():
        return "gradd._c10d (the torch.distributed backend 'gradd') is not built"
    if device.type != "cpu":
        return "the model is on a GPU and the gradd backend takes CPU tensors"
    if not getattr(world, "ranks_are_group_ranks", True):
        return ("the job's ranks are numbered differently from the process group's "
                "(group ranks interleaved across nodes)")
    return None


def stands_for_job(world, group: Any) -> bool:
    """Whether `group` (a hook's state, or a state's process_group) means the
    ranks of the DDP placed as `world` (its ``group`` is the DDP's process
    group), so the job's gradd group computes the same."""
    if group is None:  # torch: the default group
        return not world.is_subgroup
    if world.group is not None and group is world.group:
        return True
    if world.is_subgroup:
        return False
    dist = _dist()
    default = _default_group()
    if default is None:
        return False
    return (group is default or group is dist.group.WORLD) and default.size() == world.world_size


class _StateView:
    """The user's hook state as the hook sees it: ``process_group`` reads as
    the job's gradd group while the user's attribute still holds the group
    it replaces; every other attribute, read or written, is the user's
    object's. ``isinstance`` sees the user's class."""

    __slots__ = ("_gradd_target", "_gradd_group", "_gradd_replaces")

    def __init__(self, target: Any, group: Any, replaces: Any):
        object.__setattr__(self, "_gradd_target", target)
        object.__setattr__(self, "_gradd_group", group)
        object.__setattr__(self, "_gradd_replaces", replaces)

    @property
    def __class__(self):  # noqa: D401 - isinstance(view, PowerSGDState)
        return type(object.__getattribute__(self, "_gradd_target"))

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_gradd_target")
        value = getattr(target, name)
        if name == "process_group" and value is object.__getattribute__(self, "_gradd_replaces"):
            return object.__getattribute__(self, "_gradd_group").get()
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_gradd_target"), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(object.__getattribute__(self, "_gradd_target"), name)

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_gradd_target"))


def hook_state(world, state: Any, group: Optional["JobGroup"]) -> Tuple[Any, str]:
    """(the state to hand the hook, why) -- see the module doc: a reference
    to the gradd group for a group meaning the DDP's ranks, a view for a
    state object carrying such a group, else `state` itself. `group`: the
    job's group, None when it is not usable."""
    dist = _dist()
    if state is None or (dist is not None and isinstance(state, dist.ProcessGroup)):
        inner, view = state, False
    else:
        try:
            inner = getattr(state, "process_group")
        except AttributeError:
            return state, "its state is not a process group and carries none"
        if inner is not None and (dist is None or not isinstance(inner, dist.ProcessGroup)):
            return state, "its state's process_group is not a process group"
        view = True
    if not stands_for_job(world, inner):
        if inner is None:
            return state, ("its state means torch's default group, which is not the DDP's "
                           "subgroup")
        return state, "its state names a process group other than the DDP's"
    if group is None:
        return state, "the job's gradd group is not usable"
    means = "None (torch's default group, the DDP's)" if inner is None else "the DDP's group"
    if view:
        return _StateView(state, group, inner), f"its state's process_group is {means}"
    return _GroupRef(group), f"its state is {means}"


class _GroupRef:
    """Marks a state that is the job group itself (resolved per call, since
    the group is attached at its first use)."""

    __slots__ = ("group",)

    def __init__(self, group: "JobGroup"):
        self.group = group


def resolve(state: Any) -> Any:
    """The object the hook is called with."""
    return state.group.get() if isinstance(state, _GroupRef) else state


# ProcessGroup methods torch.distributed calls; all go to the gradd group
# (which raises its own clear error for those it does not support).
_COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
    "_allgather_base", "allgather_coalesced", "gather", "scatter", "reduce_scatter",
    "_reduce_scatter_base", "alltoall", "alltoall_base", "barrier", "monitored_barrier",
    "send", "recv", "recv_anysource",
)


class _HookWork:
    """A collective's Work as torch's (wait, get_future, is_completed, ...),
    whose future completes on one of the group's completion threads."""

    def __init__(self, inner, future: torch.futures.Future):
        self._inner = inner
        self._future = future

    def wait(self, timeout=None) -> bool:
        self._future.wait()  # raises the collective's error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def result(self):
        return self._inner.result()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def synchronize(self) -> None:
        pass


class HookProcessGroup(dist.ProcessGroup):
    """The group a trainer-side hook gets: the job's ProcessGroupGradd, with
    every collective's future completed off its worker thread.

    Why: ProcessGroupGradd runs its collectives, in issue order, on one
    worker thread and completes their futures there, so a future callback
    that waits for a collective it issues itself (torch's PowerSGD and
    quantization hooks do, ``.get_future().wait()`` inside ``.then``) would
    block the only thread that could run it. As with Gloo's pool of worker
    threads, callbacks here run on a pool of completion threads (one more
    is started whenever all are busy, up to 32), so a blocked callback
    leaves the collectives running."""

    def __init__(self, inner):
        super().__init__(inner.rank(), inner.size())
        self._gradd_inner = inner
        self._gradd_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=32, thread_name_prefix="gradd-hook-futures")

    @property
    def job_id(self) -> str:
        return self._gradd_inner.job_id

    def getBackendName(self) -> str:  # PyProcessGroup's name()
        return "gradd"

    def _gradd_wrap(self, work) -> _HookWork:
        out = torch.futures.Future()
        pool = self._gradd_pool

        def settle(fn, arg):
            try:
                pool.submit(fn, arg)
            except RuntimeError:  # closed (the model shut down): complete here
                fn(arg)

        def complete(done):
            try:
                value = done.value()
            except Exception as e:  # the collective failed
                settle(out.set_exception, e)
            else:
                settle(out.set_result, value)

        work.get_future().add_done_callback(complete)
        return _HookWork(work, out)

    def close(self) -> None:
        self._gradd_pool.shutdown(wait=False)


def _forward(name: str):
    def call(self, *args, **kwargs):
        return self._gradd_wrap(getattr(self._gradd_inner, name)(*args, **kwargs))

    call.__name__ = name
    return call


for _name in _COLLECTIVES:
    setattr(HookProcessGroup, _name, _forward(_name))


class JobGroup:
    """The job's gradd ProcessGroup for one DDP model (module doc): `world`
    is the DDP's placement (a gradd._world.World), `socket` and
    `wait_timeout` its attach options."""

    def __init__(self, world, *, socket: Optional[str], wait_timeout: float):
        self._world = world
        self._socket = socket
        self._wait_timeout = wait_timeout
        self.job_id = f"{world.job_id}/{SUFFIX}"
        self._pg = None
        self._registered = False
        # torch's rank table of the group it stands for (global -> group
        # rank), taken now: the DDP's group may be destroyed before close.
        self._ranks = self._group_ranks()

    def _group_ranks(self) -> Optional[dict]:
        default = _default_group()
        if default is None:
            return None
        from torch.distributed import distributed_c10d as c10d

        group = self._world.group
        if group is None or group is default:
            return {r: r for r in range(default.size())}
        ranks = c10d._pg_group_ranks.get(group)
        return dict(ranks) if ranks is not None else None

    @property
    def created(self) -> bool:
        return self._pg is not None

    def get(self) -> HookProcessGroup:
        """The group hooks get (attached on first use)."""
        if self._pg is None:
            self._pg = HookProcessGroup(self._create())
            self._register()
        return self._pg

    def raw(self):
        """The ProcessGroupGradd itself, for gradd's own collectives (no
        callbacks: no completion threads needed)."""
        return self.get()._gradd_inner

    def _create(self):
        from gradd import distributed

        world = self._world
        collective_bytes = int(os.environ.get("GRADD_COLLECTIVE_BYTES", "") or 0)
        multi = world.num_nodes > 1
        return distributed._c10d.create(
            world.rank,
            world.world_size,
            job_id=self.job_id,
            socket=self._socket or "",
            local_rank=world.local_rank,
            local_world_size=world.local_world_size,
            node_rank=world.node_rank,
            num_nodes=world.num_nodes,
            coordinator=world.coordinator if multi else "",
            timeout=float(self._wait_timeout),
            collective_bytes=collective_bytes,
        )

    def _register(self) -> None:
        if self._ranks is None or _default_group() is None:
            return
        from torch.distributed import distributed_c10d as c10d

        c10d._pg_group_ranks[self._pg] = dict(self._ranks)
        c10d._pg_map[self._pg] = ("gradd", None)
        self._registered = True

    def close(self) -> None:
        """Leaves torch's tables and drops the group (its client detaches)."""
        pg, self._pg = self._pg, None
        if pg is None:
            return
        if self._registered:
            from torch.distributed import distributed_c10d as c10d

            c10d._pg_group_ranks.pop(pg, None)
            c10d._pg_map.pop(pg, None)
            self._registered = False
        pg.close()


def describe(hook_name: str, world, passed: Any, why: str, reason: Optional[str]) -> str:
    """The INFO line saying which path a trainer-side hook takes."""
    who = f"job '{world.job_id}', rank {world.rank}"
    if isinstance(passed, (_GroupRef, _StateView)):
        return (f"gradd ({who}): communication hook {hook_name} runs in the trainer over the "
                f"job's gradd collectives (job '{world.job_id}/{SUFFIX}'): {why}")
    if reason is not None and why == "the job's gradd group is not usable":
        why = f"the job's gradd group is not usable: {reason}"
    return (f"gradd ({who}): communication hook {hook_name} runs in the trainer over the "
            f"process group its state names: {why}")
