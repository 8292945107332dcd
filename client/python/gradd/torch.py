"""gradd.torch: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

::

    from gradd.torch import DistributedDataParallel as DDP
    model = DDP(model)                 # rank/world from RANK, WORLD_SIZE, ...
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward() # grads are averaged when this returns
        opt.step()

No ``torch.distributed.init_process_group`` is needed: the node's gradd daemon
(socket from ``socket=``, ``$GRADD_SOCKET`` or the daemon's default path) does
the communication. Each ``param.grad`` is a view into bucket memory shared with
the daemon (``gradient_as_bucket_view`` is always on), autograd's gradient
accumulator of every parameter is hooked so that a bucket is handed to the
daemon as soon as its last gradient is ready (overlapping the rest of
backward), and a callback queued on the autograd engine waits for every bucket
before ``backward()`` returns.

Environment (torchrun's names): RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK / NODE_RANK, MASTER_ADDR, MASTER_PORT; gradd's:
GRADD_SOCKET, GRADD_JOB (job id; default ``torch-MASTER_ADDR:MASTER_PORT``),
GRADD_COORDINATOR (multi-node rendezvous; default MASTER_ADDR:MASTER_PORT).
"""
from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from typing import Iterable, List, Optional, Sequence, Tuple

import torch  # the real torch: this module is gradd.torch, imports are absolute

import gradd._C as _C
from gradd._C import GraddError

__all__ = ["DistributedDataParallel", "GraddError"]

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

_MiB = 1 << 20


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _first(*values):
    for v in values:
        if v is not None:
            return v
    return None


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over t's memory (t must be contiguous)."""
    flat = t.reshape(-1)
    if flat.dtype == torch.uint8:
        return flat
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(torch.uint8)


class DistributedDataParallel(torch.nn.Module):
    """Data parallelism through the node's gradd daemon.

    Takes torch DDP's constructor arguments. ``device_ids``/``output_device``
    must be None (CPU modules), ``process_group`` is ignored (the daemon
    forms the group from the job id), ``dim`` and ``check_reduction`` are
    accepted for compatibility, ``gradient_as_bucket_view`` is always true.

    gradd-specific keyword arguments: ``socket``, ``job_id``, ``rank``,
    ``world_size``, ``local_rank``, ``local_world_size``, ``node_rank``,
    ``coordinator`` (default from the environment, see the module doc),
    ``first_bucket_cap_mb`` (None: the daemon's 1 MiB), ``broadcast_chunk_mb``
    (largest single broadcast; default 64), ``connect_timeout``,
    ``attach_timeout``, ``wait_timeout`` (seconds).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Optional[Sequence] = None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group=None,
        bucket_cap_mb: float = 25,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = True,
        static_graph: bool = False,
        *,
        socket: Optional[str] = None,
        job_id: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        local_rank: Optional[int] = None,
        local_world_size: Optional[int] = None,
        node_rank: Optional[int] = None,
        coordinator: Optional[str] = None,
        first_bucket_cap_mb: Optional[float] = None,
        broadcast_chunk_mb: float = 64,
        connect_timeout: float = 10.0,
        attach_timeout: float = 120.0,
        wait_timeout: float = 600.0,
    ):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any "
                "parameter that requires a gradient."
            )
        for n, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.device.type != "cpu":
                raise NotImplementedError(
                    f"gradd.torch supports CPU tensors only; '{n}' is on {p.device}"
                )
        if device_ids is not None or output_device is not None:
            raise ValueError(
                "device_ids and output_device must be None for a CPU module "
                f"(got device_ids={device_ids!r}, output_device={output_device!r})"
            )
        if process_group is not None:
            warnings.warn(
                "gradd.torch.DistributedDataParallel ignores process_group: the gradd "
                "daemon forms the group from the job id and ranks",
                stacklevel=2,
            )
        for n, p in named:
            if p.dtype not in _DTYPES:
                raise TypeError(
                    f"parameter '{n}' has dtype {p.dtype}; gradd reduces float32, "
                    "float64, float16 and bfloat16"
                )
            if p.layout != torch.strided:
                raise NotImplementedError(f"parameter '{n}' is not a dense tensor")

        self.module = module
        self.device_ids = None
        self.output_device = None
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.process_group = process_group
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = True
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._failure: Optional[BaseException] = None
        self._client = None

        # -- who we are ---------------------------------------------------
        env_rank = _env_int("RANK")
        env_world = _env_int("WORLD_SIZE")
        self.rank = int(_first(rank, env_rank, 0))
        self.world_size = int(_first(world_size, env_world, 1))
        self.local_world_size = int(
            _first(local_world_size, _env_int("LOCAL_WORLD_SIZE"), self.world_size)
        )
        self.local_rank = int(
            _first(local_rank, _env_int("LOCAL_RANK"), self.rank % self.local_world_size)
        )
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local rank {self.local_rank} is not in a local world of size "
                f"{self.local_world_size}"
            )
        if self.world_size % self.local_world_size != 0:
            raise ValueError(
                f"WORLD_SIZE {self.world_size} is not a multiple of LOCAL_WORLD_SIZE "
                f"{self.local_world_size}"
            )
        self.num_nodes = self.world_size // self.local_world_size
        master = None
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        self.node_rank = int(
            _first(
                node_rank,
                _env_int("GROUP_RANK"),
                _env_int("NODE_RANK"),
                self.rank // self.local_world_size,
            )
        )
        self.job_id = _first(
            job_id, os.environ.get("GRADD_JOB") or None, f"torch-{master}" if master else None, "default"
        )
        coordinator = _first(coordinator, os.environ.get("GRADD_COORDINATOR") or None, master, "")

        # -- attach and register -----------------------------------------
        self._param_names: List[str] = [n for n, _ in named]
        self._params: List[torch.nn.Parameter] = [p for _, p in named]
        specs = [(n, tuple(p.shape), _DTYPES[p.dtype]) for n, p in named]
        state = self._module_states()
        state_bytes = sum(t.numel() * t.element_size() for t in state)
        self._bcast_bytes = 0
        if self.world_size > 1:
            self._bcast_bytes = int(max(4096, min(state_bytes, broadcast_chunk_mb * _MiB)))
        multi = self.num_nodes > 1
        self._client = _C.attach(
            specs,
            socket=socket or "",
            job_id=self.job_id,
            local_rank=self.local_rank,
            local_world_size=self.local_world_size,
            bucket_cap_mb=float(bucket_cap_mb),
            first_bucket_cap_mb=float(first_bucket_cap_mb or 0.0),
            broadcast_bytes=self._bcast_bytes,
            connect_timeout=connect_timeout,
            attach_timeout=attach_timeout,
            wait_timeout=wait_timeout,
            node_rank=self.node_rank if multi else None,
            num_nodes=self.num_nodes if multi else 0,
            coordinator=coordinator if multi else "",
        )
        if self._client.world_size != self.world_size or self._client.global_rank != self.rank:
            got = (self._client.global_rank, self._client.world_size)
            self._client.detach()
            raise GraddError(
                f"job '{self.job_id}': the daemon placed this trainer at rank {got[0]} of "
                f"{got[1]}, but the environment says rank {self.rank} of {self.world_size}"
            )

        # -- gradients as views into the shared buckets --------------------
        self._views: List[torch.Tensor] = []
        with torch.no_grad():
            for i, p in enumerate(self._params):
                view = torch.from_numpy(self._client.gradient(i))
                if p.dtype == torch.bfloat16:
                    view = view.view(torch.bfloat16)
                view = view.view(p.shape)
                if p.grad is not None:
                    view.copy_(p.grad)
                else:
                    view.zero_()
                p.grad = view
                self._views.append(view)

        # -- every rank starts from rank 0's state -------------------------
        if self.world_size > 1:
            self._broadcast_tensors(state)

        # -- autograd hooks ------------------------------------------------
        self._marked = [False] * len(self._params)
        self._callback_queued = False
        self._sync_this_backward = True
        self._grad_accs = []
        self_ref = weakref.ref(self)
        with torch.enable_grad():
            for i, p in enumerate(self._params):
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(self_ref, i))
                self._grad_accs.append(acc)  # the param holds it only weakly

    # ------------------------------------------------------------------ info
    @property
    def client(self) -> "_C.Client":
        """The underlying gradd._C.Client."""
        return self._client

    @property
    def num_buckets(self) -> int:
        return self._client.num_buckets

    def bucket_info(self) -> List[dict]:
        """Per bucket: dtype, size_bytes and the names of its parameters."""
        out = []
        for b in range(self._client.num_buckets):
            info = self._client.bucket(b)
            info["param_names"] = [self._param_names[i] for i in info["params"]]
            out.append(info)
        return out

    @property
    def parameter_names(self) -> List[str]:
        """Names of the registered parameters, in registration order."""
        return list(self._param_names)

    # --------------------------------------------------------------- forward
    def forward(self, *inputs, **kwargs):
        self._raise_if_failed()
        if self._client is None:
            raise RuntimeError(
                f"gradd.torch.DistributedDataParallel (job '{self.job_id}', rank "
                f"{self.rank}) was shut down; use .module to run the model locally"
            )
        grad_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if torch.is_grad_enabled():
            if grad_sync and any(self._marked):
                self._fail(
                    RuntimeError(
                        "Expected to have finished reduction in the prior iteration before "
                        "starting a new one: the previous backward() did not complete "
                        f"(job '{self.job_id}', rank {self.rank})"
                    )
                )
            self._sync_this_backward = grad_sync
        if self.require_forward_param_sync and self.broadcast_buffers and self.world_size > 1:
            buffers = [b for b in self.module.buffers()]
            if buffers:
                self._broadcast_tensors(buffers)
        output = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = grad_sync
        return output

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, forward+backward accumulate gradients locally (in the shared
        views) without talking to the daemon; the first synced backward after
        it averages the accumulated gradients."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ------------------------------------------------------- not supported
    def register_comm_hook(self, state, hook):
        """torch's hooks run in the daemon: see gradd/_comm_hooks.py."""
        from gradd import _comm_hooks

        _comm_hooks.register_comm_hook(self, state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type):
        from gradd import _comm_hooks

        _comm_hooks.register_builtin_comm_hook(self, comm_hook_type)

    def join(self, *args, **kwargs):
        raise NotImplementedError("gradd.torch does not implement join() yet")

    def _set_static_graph(self):
        self.static_graph = True

    # ---------------------------------------------------------------- close
    def shutdown(self) -> None:
        """Detaches from the daemon. Gradients stay readable (the memory stays
        mapped while views exist) but are no longer averaged."""
        client, self._client = self.__dict__.get("_client"), None
        if client is not None:
            client.detach()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # never raise from a finaliser
            pass

    # ------------------------------------------------------------ internals
    def _module_states(self) -> List[torch.Tensor]:
        """What torch DDP syncs at construction: state_dict()'s tensors
        (parameters and persistent buffers), deduplicated."""
        seen = set()
        out = []
        for t in self.module.state_dict().values():
            if not isinstance(t, torch.Tensor) or id(t) in seen:
                continue
            seen.add(id(t))
            out.append(t.detach())
        return out

    def _broadcast_tensors(self, tensors: Iterable[torch.Tensor]) -> None:
        """Overwrites `tensors` with rank 0's, through the daemon, packed into
        chunks of at most the attach's broadcast area."""
        self._raise_if_failed()
        chunk = self._bcast_bytes
        staging = torch.empty(chunk, dtype=torch.uint8)
        staging_np = staging.numpy()
        pending: List[Tuple[torch.Tensor, int, int, int]] = []  # (bytes, src_off, len, dst_off)
        writeback: List[Tuple[torch.Tensor, torch.Tensor]] = []
        used = 0

        def flush():
            nonlocal used
            if used == 0:
                return
            try:
                self._client.broadcast(staging_np[:used], 0)
            except GraddError as e:
                self._fail(e)
            for dst, off, n, at in pending:
                dst[off : off + n].copy_(staging[at : at + n])
            pending.clear()
            used = 0

        with torch.no_grad():
            for t in tensors:
                if t.numel() == 0:
                    continue
                t = t.detach()
                if t.is_contiguous():
                    src = t
                else:
                    src = t.contiguous()
                    writeback.append((t, src))
                data = _bytes_of(src)
                total = data.numel()
                off = 0
                while off < total:
                    n = min(total - off, chunk - used)
                    staging[used : used + n].copy_(data[off : off + n])
                    pending.append((data, off, n, used))
                    used += n
                    off += n
                    if used == chunk:
                        flush()
            flush()
            for t, src in writeback:
                t.copy_(src)

    @staticmethod
    def _make_hook(self_ref, index: int):
        def hook(*unused):
            ddp = self_ref()
            if ddp is not None:
                ddp._on_grad_ready(index)

        return hook

    def _on_grad_ready(self, i: int) -> None:
        if not self._sync_this_backward or self._client is None:
            return  # no_sync(): accumulate locally
        self._raise_if_failed()
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        self._hand_over(i)

    def _hand_over(self, i: int) -> None:
        """Puts parameter i's gradient in its shared view and marks it ready."""
        p, view = self._params[i], self._views[i]
        g = p.grad
        if g is not None and not self._is_view(g, view):
            # zero_grad(set_to_none=True), create_graph or a user replaced
            # .grad: bring the fresh gradient into shared memory.
            with torch.no_grad():
                view.copy_(g)
            p.grad = view
        self._marked[i] = True
        try:
            self._client.mark_ready(i)
        except GraddError as e:
            self._fail(e)

    @staticmethod
    def _is_view(g: torch.Tensor, view: torch.Tensor) -> bool:
        return (
            g.data_ptr() == view.data_ptr()
            and g.dtype == view.dtype
            and g.shape == view.shape
            and g.stride() == view.stride()
        )

    def _finish_backward(self) -> None:
        self._callback_queued = False
        missing = [i for i, m in enumerate(self._marked) if not m]
        unused_none = []
        if missing:
            if not self.find_unused_parameters:
                names = ", ".join(self._param_names[i] for i in missing)
                self._fail(
                    RuntimeError(
                        f"gradd (job '{self.job_id}', rank {self.rank}): parameters that "
                        f"did not receive a gradient in this backward pass: {names}. "
                        "Pass find_unused_parameters=True to DistributedDataParallel "
                        "if the module has parameters that do not take part in the "
                        "loss, and make sure all forward outputs contribute to it."
                    )
                )
            for i in missing:
                if self._params[i].grad is None:
                    with torch.no_grad():
                        self._views[i].zero_()  # contributes zeros, as in torch DDP
                    unused_none.append(i)
                self._hand_over(i)
        try:
            self._client.wait_all()
        except GraddError as e:
            self._fail(e)
        self._marked = [False] * len(self._params)
        # A parameter nobody used keeps grad None (as in torch DDP); one that
        # another rank used gets the average.
        for i in unused_none:
            if bool(self._views[i].any()):
                self._params[i].grad = self._views[i]

    def _fail(self, error: BaseException):
        """Records the first error: the job can't continue after it."""
        if self._failure is None:
            self._failure = error
        raise error

    def _raise_if_failed(self):
        if self._failure is not None:
            raise RuntimeError(
                f"gradd job '{self.job_id}' (rank {self.rank}) failed earlier: {self._failure}"
            ) from self._failure
