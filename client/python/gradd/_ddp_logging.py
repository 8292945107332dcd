"""``_get_ddp_logging_data()``: torch 1.13's DDP logging dict, from gradd's
own state. Same key names and value types as torch (strings for lists,
ints for flags, nanoseconds for times); gradd-only facts get ``gradd_*``
keys.

One :class:`RuntimeLog` per DDP holds what torch's ``Logger`` keeps (the
sample rate, the last sampled iteration's times, the error DDP logged); the
DDP hands it its client and reducer when it asks for the data, and the
report reads only torch's own public DDP attributes (``world_size``,
``broadcast_buffers``, ...). It imports no other part of gradd.torch, so
every other module may import it."""
from __future__ import annotations

import os
import time
from typing import Optional

# Host clock (ns since the epoch, as torch's logger stamps) of the reducer's
# time.monotonic_ns() readings: one offset per process, so the stamps keep
# their monotonic order.
_HOST_CLOCK_OFFSET_NS = time.time_ns() - time.monotonic_ns()

_TORCH_DTYPE_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
}


def bucket_sizes(client, params) -> list:
    """Per bucket, the bytes of its parameters, as torch reports them (its
    flat bucket tensor holds exactly those): gradd's buckets may also hold
    the hidden used map or alignment padding, and a bucket that holds only
    the used map is not one torch would have."""
    if client is None:
        return []
    out = []
    for b in range(client.num_buckets):
        idx = client.bucket(b)["params"]
        if idx:
            out.append(sum(params[i].numel() * params[i].element_size() for i in idx))
    return out


def rebuild_fields(client, params) -> dict:
    """The rebuild fields of torch's ``_get_ddp_logging_data()``, in its
    format: ``has_rebuilt_buckets`` (0/1) and, once rebuilt,
    ``rebuilt_bucket_sizes`` ("6016, 240000") and
    ``rebuilt_per_bucket_param_indices`` ("1 0 3, 2"); see gradd/_rebuild.py."""
    rebuilt = client is not None and client.has_rebuilt_buckets
    out = {"has_rebuilt_buckets": int(rebuilt)}
    if rebuilt:
        buckets = [client.bucket(b)["params"] for b in range(client.num_buckets)]
        out["rebuilt_bucket_sizes"] = ", ".join(str(n) for n in bucket_sizes(client, params))
        out["rebuilt_per_bucket_param_indices"] = ", ".join(
            " ".join(str(i) for i in idx) for idx in buckets if idx
        )
    return out


def _env(name: str) -> str:
    """torch's logger reports these variables as set, else "N/A"."""
    return os.environ.get(name, "N/A")


def _backend_name(ddp) -> str:
    """torch reports the backend of the DDP's process group. gradd does the
    same when there is one (the group the job was formed through, and the
    one trainer-side comm hooks use); the gradients themselves always go
    through the gradd daemon (``gradd_job_id``). Without a group: "gradd"."""
    group = getattr(ddp, "process_group", None)
    if group is None:
        return "gradd"
    try:
        import torch.distributed as dist

        return str(dist.get_backend(group))
    except Exception:  # a group torch no longer knows (destroyed)
        return "gradd"


def _group_options(group):
    """The options (Gloo's: ``_threads``) a process group was made with:
    torch 1.13's group is the backend and has them; torch 2's
    ProcessGroup wraps one backend per device type, which has them."""
    options = getattr(group, "options", None)
    if options is not None or not hasattr(group, "_get_backend"):
        return options
    try:
        import torch

        return getattr(group._get_backend(torch.device("cpu")), "options", None)
    except Exception:  # no CPU backend in this group
        return None


class RuntimeLog:
    """One DDP's logging state, as torch's ``Logger`` keeps it: the runtime
    sample rate, the last sampled iteration with its times, and the error
    DDP logged (``has_error`` / ``error``). `params`: the DDP's dense
    parameters, in registration order. Runs on the trainer's main thread."""

    def __init__(self, params) -> None:
        self.params = params
        self.sample_rate = 100  # torch's kDDPRuntimeLoggingSampleRate
        # (last sampled iteration, its times): see sample().
        self.sampled = None
        self.error: Optional[str] = None

    def record_error(self, message: str, *, first_only: bool = False) -> None:
        if first_only and self.error is not None:
            return
        self.error = message

    def set_sample_rate(self, sample_rate: int) -> None:
        """torch's ``_set_ddp_runtime_logging_sample_rate`` (its check and
        message, logged as torch's logger does)."""
        if sample_rate < 1:
            message = "DDP runtime logging sample rate should be equal or greater than 1"
            self.record_error(f"{ValueError}: {message}")
            raise ValueError(message)
        self.sample_rate = int(sample_rate)

    def sample(self, iteration: int, reducer) -> None:
        """Called by a synced forward before it counts its iteration, where
        torch's logger records runtime stats: iterations 1..10, then every
        `sample_rate`-th, keep the iteration number and its times (torch's
        ``iteration`` key only moves at sampled iterations)."""
        n = iteration
        if n > 0 and (n <= 10 or n % self.sample_rate == 0) and reducer is not None:
            self.sampled = (n, dict(reducer.last))

    def data(self, ddp, client, reducer) -> dict:
        """torch's ``_get_ddp_logging_data()``: `ddp`'s public (torch's)
        attributes, `client` and `reducer` (None in an unpickled copy
        before its first forward)."""
        params = self.params
        buckets = bucket_sizes(client, params)
        dtypes = []
        for p in params:
            name = _TORCH_DTYPE_NAMES.get(str(p.dtype).replace("torch.", ""), str(p.dtype))
            if name not in dtypes:
                dtypes.append(name)
        iterations_done = reducer.iterations_done if reducer is not None else 0
        unused = reducer.unused_parameter_size if reducer is not None else 0
        done = max(1, iterations_done)
        # (last sampled iteration, its times): see sample().
        sampled = self.sampled or (0, None)
        data = {
            # strings, as torch's strs_map
            "backend_name": _backend_name(ddp),
            "module_name": type(ddp.module).__name__,
            "device_ids": "",
            "dtypes": ", ".join(dtypes),
            "bucket_sizes": ", ".join(str(b) for b in buckets),
            "master_addr": _env("MASTER_ADDR"),
            "master_port": _env("MASTER_PORT"),
            "torch_distributed_debug": _env("TORCH_DISTRIBUTED_DEBUG"),
            "cuda_visible_devices": _env("CUDA_VISIBLE_DEVICES"),
            # ints, as torch's ints_map
            "world_size": ddp.world_size,
            "rank": ddp.rank,
            "output_device": -1,
            "broadcast_buffers": int(bool(ddp.broadcast_buffers)),
            "bucket_cap_bytes": int(ddp.bucket_cap_mb * 1024 * 1024),
            "find_unused_parameters": int(bool(ddp.find_unused_parameters)),
            "gradient_as_bucket_view": int(bool(ddp.gradient_as_bucket_view)),
            "static_graph": int(bool(ddp.static_graph)),
            "is_multi_device_module": 0,
            "num_parameter_tensors": len(params),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "iteration": sampled[0],
            # torch reports whether the graph looked static so far; gradd knows
            # as much as "no parameter went unused and none fired twice".
            "can_set_static_graph": int(unused == 0),
            "unused_parameter_size": unused,
            "gradd_job_id": ddp.job_id,
            "gradd_num_buckets": len(buckets),
            "gradd_runtime_logging_sample_rate": self.sample_rate,
        }
        if data["backend_name"] == "gloo":
            # As torch's logger for a Gloo group: its environment and threads.
            data["gloo_socket_ifname"] = _env("GLOO_SOCKET_IFNAME")
            data["gloo_device_transport"] = _env("GLOO_DEVICE_TRANSPORT")
            threads = getattr(_group_options(ddp.process_group), "_threads", None)
            if threads is not None:
                data["gloo_num_threads"] = int(threads)
        # torch's logger: has_error (and the message) once DDP raised an error it
        # logs (a failed iteration, a misuse such as a late _set_static_graph).
        error = self.error
        if error is not None:
            data["has_error"] = 1
            data["error"] = error
        if iterations_done:
            t, last = reducer.totals, sampled[1] or reducer.last
            data.update(
                avg_forward_compute_time=t["forward"] // done,
                avg_backward_compute_time=t["backward_compute"] // done,
                avg_backward_comm_time=t["backward_comm"] // done,
                avg_backward_compute_comm_overlap_time=t["overlap"] // done,
                forward_compute_time=last["forward"],
                backward_compute_time=last["backward_compute"],
                backward_comm_time=last["backward_comm"],
                backward_compute_comm_overlap_time=last["overlap"],
            )
            # Host-clock stamps (ns since the epoch) of that iteration, as
            # torch's: its module forward's start, backward compute from the end
            # of forward to the end-of-backward callback, comm from the first
            # gradient handed over to all averaged.
            for key, stamp in (
                ("forward_compute_time_start", "t_forward_start"),
                ("backward_compute_time_start", "t_forward_end"),
                ("backward_compute_time_end", "t_compute_end"),
                ("backward_comm_time_start", "t_first_mark"),
                ("backward_comm_time_end", "t_done"),
            ):
                if stamp in last:
                    data[key] = last[stamp] + _HOST_CLOCK_OFFSET_NS
            # torch's: the order (indices into the DDP's parameters) in which
            # the gradients became ready in the backward before that forward.
            if last.get("ready_order"):
                data["prev_iteration_grad_ready_order_indices"] = ", ".join(
                    str(i) for i in last["ready_order"]
                )
        data.update(rebuild_fields(client, params))
        return data
