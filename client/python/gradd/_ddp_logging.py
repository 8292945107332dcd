"""``_get_ddp_logging_data()``: torch 1.13's DDP logging dict, from gradd's
own state. Same key names and value types as torch (strings for lists,
ints for flags, nanoseconds for times); gradd-only facts get ``gradd_*``
keys."""
from __future__ import annotations

from gradd import _rebuild

_TORCH_DTYPE_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
}


def bucket_sizes(ddp) -> list:
    """Per bucket, the bytes of its parameters, as torch reports them (its
    flat bucket tensor holds exactly those): gradd's buckets may also hold
    the hidden used map or alignment padding, and a bucket that holds only
    the used map is not one torch would have."""
    client = ddp._client
    if client is None:
        return []
    out = []
    for b in range(client.num_buckets):
        idx = client.bucket(b)["params"]
        if idx:
            out.append(sum(ddp._params[i].numel() * ddp._params[i].element_size() for i in idx))
    return out


def logging_data(ddp) -> dict:
    reducer = ddp._reducer
    params = ddp._params
    buckets = bucket_sizes(ddp)
    dtypes = []
    for p in params:
        name = _TORCH_DTYPE_NAMES.get(str(p.dtype).replace("torch.", ""), str(p.dtype))
        if name not in dtypes:
            dtypes.append(name)
    done = max(1, reducer.iterations_done)
    data = {
        # strings, as torch's strs_map
        "backend_name": "gradd",
        "module_name": type(ddp.module).__name__,
        "device_ids": "",
        "dtypes": ", ".join(dtypes),
        "bucket_sizes": ", ".join(str(b) for b in buckets),
        "master_addr": "N/A",
        "master_port": "N/A",
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
        "iteration": ddp.num_iterations,
        "has_rebuilt_buckets": int(bool(getattr(ddp, "_has_rebuilt_buckets", False))),
        # torch reports whether the graph looked static so far; gradd knows
        # as much as "no parameter went unused and none fired twice".
        "can_set_static_graph": int(reducer.unused_parameter_size == 0),
        "unused_parameter_size": reducer.unused_parameter_size,
        "gradd_job_id": ddp.job_id,
        "gradd_num_buckets": len(buckets),
    }
    if reducer.iterations_done:
        t, last = reducer.totals, reducer.last
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
    data.update(_rebuild.logging_fields(ddp))
    return data
