"""Who am I, and which job: the world of one DistributedDataParallel.

torch's DDP takes its world from a process group (the default one, or the
``process_group=`` argument); gradd's daemon needs the same facts in its own
terms: the job's rank and size, this trainer's local rank among the job's
trainers on its node (a node being one gradd daemon), the node's rank and the
number of nodes, and a job id every rank of the job agrees on.

With a process group (``dist.init_process_group`` was called, or
``process_group=`` given):

* rank and world size are the group's (``dist.get_rank(group)``,
  ``dist.get_world_size(group)``), whatever the environment says; RANK /
  WORLD_SIZE (and rank= / world_size=) that contradict the group are an
  error naming both.
* The node layout: for the default group, LOCAL_RANK / LOCAL_WORLD_SIZE /
  GROUP_RANK from the environment when set (torchrun's agent knows best);
  otherwise -- and always for a subgroup, which the environment does not
  describe -- every member contributes (hostname, resolved gradd socket
  path) with ``all_gather_object``: members with the same pair are on the
  same node. The socket is part of "node" because a daemon *is* a node to
  gradd: two daemons on one host (how tests emulate two machines) are two
  nodes. Nodes are ordered by their lowest group rank, local ranks by group
  rank, so group rank 0 is always the job's rank 0 (the root of the
  parameter broadcast, as torch's ``_sync_module_states`` uses). gradd
  requires the same number of trainers on every node of a job.
* The job id: unless the user names one (job_id= / GRADD_JOB), group rank
  0's fresh ``torch-<12 hex>`` travels in the same ``all_gather_object``, so
  every construction (two trainings one after another, the n-th model of a
  process, two jobs started in the same second) gets its own job. One
  collective per construction, on the group, like torch's own constructor
  (which broadcasts the module states); it waits as long as the group's
  timeout (``init_process_group(timeout=)``).

Without a process group, the launcher's environment as before (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK / NODE_RANK,
GROUP_WORLD_SIZE); the job id comes from torchrun's agent store when there is
one (TORCHELASTIC_USE_AGENT_STORE), else ``torch-MASTER_ADDR:MASTER_PORT``
(unique while that port is held by the launcher), else, for a world of one, a
fresh id; a larger world with none of these must name its job.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket as _socket
import uuid
from typing import List, Optional

from gradd import _jobs


@dataclasses.dataclass
class World:
    rank: int  # the job's rank of this trainer (group rank 0 is 0)
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    coordinator: str  # the rendezvous coordinator's host ("" single node)
    job_id: str
    group: object = None  # the torch process group, or None
    is_subgroup: bool = False
    group_rank: Optional[int] = None  # dist.get_rank(group)
    global_ranks: Optional[List[int]] = None  # the group's members, by group rank
    # Whether every member's job rank is its group rank (the same answer on
    # every member; False when group ranks interleave across nodes).
    ranks_are_group_ranks: bool = True


def env_int(name: str) -> Optional[int]:
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


def socket_path(socket: Optional[str]) -> str:
    """The daemon socket the client library will use (client/src: socket=,
    else $GRADD_SOCKET, else common/session.h's DefaultSocketPath), resolved
    so that two spellings of one path are one node."""
    path = socket or os.environ.get("GRADD_SOCKET") or ""
    if not path:
        if os.geteuid() == 0:
            path = "/run/gradd/gradd.sock"
        elif os.environ.get("XDG_RUNTIME_DIR"):
            path = os.path.join(os.environ["XDG_RUNTIME_DIR"], "gradd", "gradd.sock")
        else:
            path = f"/tmp/gradd-{os.getuid()}/gradd.sock"
    return os.path.realpath(path)


def fresh_job_id() -> str:
    return f"torch-{uuid.uuid4().hex[:12]}"


def _group_suffix(global_ranks: List[int]) -> str:
    """A name for a subgroup inside an explicit job id: its members (the
    same on every member, and different for different groups)."""
    ranks = sorted(global_ranks)
    if len(ranks) <= 8:
        return "ranks-" + "-".join(str(r) for r in ranks)
    digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]
    return f"ranks-{ranks[0]}-n{len(ranks)}-{digest}"


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:  # torch without distributed support
        return None
    return dist if dist.is_available() else None


def default_group():
    """torch's default process group, or None when none is initialised."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_group()


def resolve(
    process_group,
    *,
    socket: Optional[str],
    job_id: Optional[str],
    rank: Optional[int],
    world_size: Optional[int],
    local_rank: Optional[int],
    local_world_size: Optional[int],
    node_rank: Optional[int],
    coordinator: Optional[str],
    device=None,
) -> World:
    """The world of one DDP construction (see the module doc). `device`:
    the module's; a CUDA module's GPU is current during the exchange (NCCL
    groups gather objects through the current device)."""
    dist = _dist()
    default = default_group()
    group = process_group
    if group is not None:
        if dist is None or default is None:
            raise RuntimeError(
                "process_group= was given but torch.distributed is not initialised "
                "(call dist.init_process_group first)"
            )
        if group is dist.group.WORLD:
            group = default
    else:
        group = default
    if group is None:
        return _from_environment(
            socket=socket, job_id=job_id, rank=rank, world_size=world_size,
            local_rank=local_rank, local_world_size=local_world_size,
            node_rank=node_rank, coordinator=coordinator,
        )
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        current = torch.cuda.device(device)
    else:
        current = contextlib.nullcontext()
    with current:
        return _from_group(
            dist, group, group is not default, socket=socket, job_id=job_id, rank=rank,
            world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
            node_rank=node_rank, coordinator=coordinator,
        )


def _check_same(what: str, given: Optional[int], source: str, actual: int, group_desc: str):
    if given is not None and int(given) != actual:
        raise ValueError(
            f"{source} says {what} {given}, but the process group ({group_desc}) says "
            f"{what} {actual}"
        )


def _from_group(dist, group, is_subgroup, *, socket, job_id, rank, world_size, local_rank,
                local_world_size, node_rank, coordinator) -> World:
    global_rank, global_world = dist.get_rank(), dist.get_world_size()
    desc = "torch's default group" if not is_subgroup else "process_group="
    # The environment describes the launcher's (default) world.
    _check_same("RANK", env_int("RANK"), "the environment", global_rank,
                "torch's default group")
    _check_same("WORLD_SIZE", env_int("WORLD_SIZE"), "the environment", global_world,
                "torch's default group")
    group_rank, group_size = dist.get_rank(group), dist.get_world_size(group)
    if group_rank < 0:
        raise ValueError(
            f"global rank {global_rank} is not a member of the process_group given to "
            "DistributedDataParallel (only the group's members construct its DDP)"
        )
    _check_same("rank", rank, "rank=", group_rank, desc)
    _check_same("world size", world_size, "world_size=", group_size, desc)

    me = (_socket.gethostname(), socket_path(socket), global_rank, fresh_job_id())
    everyone: List[tuple] = [None] * group_size
    # One collective: the node layout and group rank 0's job id.
    dist.all_gather_object(everyone, me, group=group)
    global_ranks = [e[2] for e in everyone]
    nodes: dict = {}  # (host, socket) -> group ranks, in group-rank order
    for grank, (host, sock, _, _) in enumerate(everyone):
        nodes.setdefault((host, sock), []).append(grank)
    order = sorted(nodes, key=lambda k: nodes[k][0])
    sizes = {k: len(v) for k, v in nodes.items()}
    if len(set(sizes.values())) != 1:
        layout = "; ".join(
            f"{host} ({sock}): group ranks {nodes[(host, sock)]}" for host, sock in order
        )
        raise ValueError(
            "gradd needs the same number of a job's trainers on every node (daemon), "
            f"but the process group's members are placed so: {layout}"
        )
    mine = (me[0], me[1])
    derived_lws = sizes[mine]
    derived_local = nodes[mine].index(group_rank)
    derived_node = order.index(mine)
    num_nodes = len(order)

    # The environment describes the default group's layout; torchrun's agent
    # knows it (and two containers may share a hostname and socket path).
    use_env = not is_subgroup
    env_lr = env_int("LOCAL_RANK") if use_env else None
    env_lws = env_int("LOCAL_WORLD_SIZE") if use_env else None
    lws = _first(local_world_size, env_lws)
    lr = _first(local_rank, env_lr)
    same_ranks = True  # the launcher's layout: job rank = group rank
    if lws is not None and lr is not None:
        lws, lr = int(lws), int(lr)
        if lws < 1 or group_size % lws != 0 or not 0 <= lr < lws:
            raise ValueError(
                f"local rank {lr} of a local world of {lws} does not fit a world of "
                f"{group_size}"
            )
        num_nodes = group_size // lws
        env_node = _first(node_rank, env_int("GROUP_RANK") if use_env else None,
                          env_int("NODE_RANK") if use_env else None)
        nrank = int(_first(env_node, group_rank // lws))
        job_rank = group_rank
    else:
        _check_same("local world size", lws, "LOCAL_WORLD_SIZE / local_world_size=",
                    derived_lws, desc + ", by host and gradd socket")
        _check_same("local rank", lr, "LOCAL_RANK / local_rank=", derived_local,
                    desc + ", by host and gradd socket")
        lws, lr = derived_lws, derived_local
        nrank = derived_node
        _check_same("node rank", node_rank, "node_rank=", nrank,
                    desc + ", by host and gradd socket")
        # The daemons place rank node_rank * L + local_rank; members of one
        # node are contiguous there even when their group ranks interleave.
        job_rank = nrank * lws + lr
        same_ranks = all(
            order.index(key) * lws + members.index(g) == g
            for key, members in nodes.items() for g in members
        )
    coord = ""
    if num_nodes > 1:
        coord = _first(
            coordinator,
            os.environ.get("GRADD_COORDINATOR") or None,
            os.environ.get("MASTER_ADDR") or None,
            everyone[0][0],
        )
    base = job_id or os.environ.get("GRADD_JOB") or None
    if base is not None:
        if is_subgroup:
            base = f"{base}/{_group_suffix(global_ranks)}"
        jid = _jobs.derive_job_id(base, global_rank)
    else:
        jid = everyone[0][3]
    return World(
        rank=job_rank, world_size=group_size, local_rank=lr, local_world_size=lws,
        node_rank=nrank, num_nodes=num_nodes, coordinator=coord, job_id=jid, group=group,
        is_subgroup=is_subgroup, group_rank=group_rank, global_ranks=global_ranks,
        ranks_are_group_ranks=same_ranks,
    )


def _from_environment(*, socket, job_id, rank, world_size, local_rank, local_world_size,
                      node_rank, coordinator) -> World:
    env_rank = env_int("RANK")
    env_world = env_int("WORLD_SIZE")
    r = int(_first(rank, env_rank, 0))
    w = int(_first(world_size, env_world, 1))
    lws = int(_first(local_world_size, env_int("LOCAL_WORLD_SIZE"), w))
    if lws < 1:
        raise ValueError(f"local world size {lws} is not positive")
    lr = int(_first(local_rank, env_int("LOCAL_RANK"), r % lws))
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank {r} is not in a world of size {w}")
    if not 0 <= lr < lws:
        raise ValueError(f"local rank {lr} is not in a local world of size {lws}")
    if w % lws != 0:
        raise ValueError(f"WORLD_SIZE {w} is not a multiple of LOCAL_WORLD_SIZE {lws}")
    num_nodes = w // lws
    groups = env_int("GROUP_WORLD_SIZE")
    if world_size is None and groups is not None and groups != num_nodes:
        raise ValueError(
            f"GROUP_WORLD_SIZE {groups} nodes x LOCAL_WORLD_SIZE {lws} is not WORLD_SIZE {w}"
        )
    nrank = int(_first(node_rank, env_int("GROUP_RANK"), env_int("NODE_RANK"), r // lws))
    # The coordinator's host only: MASTER_PORT is torch's store; the daemons
    # rendezvous on their own port (rendezvous.port, 29600).
    coord = _first(
        coordinator,
        os.environ.get("GRADD_COORDINATOR") or None,
        os.environ.get("MASTER_ADDR") or None,
        "",
    )
    jid = _environment_job_id(job_id, r, w)
    return World(rank=r, world_size=w, local_rank=lr, local_world_size=lws, node_rank=nrank,
                 num_nodes=num_nodes, coordinator=coord, job_id=jid)


def _environment_job_id(job_id: Optional[str], rank: int, world: int) -> str:
    base = job_id or os.environ.get("GRADD_JOB") or None
    if base is not None:
        return _jobs.derive_job_id(base, rank)
    agreed = _agent_store_job_id(rank)
    if agreed is not None:
        return agreed
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        # Unique while the launcher holds MASTER_PORT; the n-th model and a
        # second training in this process get /<n>.
        return _jobs.derive_job_id(f"torch-{addr}:{port}", rank)
    if world == 1:
        return fresh_job_id()
    raise ValueError(
        f"rank {rank} of {world}: gradd cannot agree on a job id with the other ranks: "
        "call torch.distributed.init_process_group first, run under torchrun, or name the "
        "job (job_id= or GRADD_JOB)"
    )


def _agent_store_job_id(rank: int) -> Optional[str]:
    """A job id agreed through torchrun's agent store (a TCPStore at
    MASTER_ADDR:MASTER_PORT that outlives the workers): the first rank to
    ask for the n-th model of this run and restart sets a fresh id, the
    others read it (compare_set: no rank waits for another)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    dist = _dist()
    if not (addr and port) or dist is None:
        return None
    import datetime

    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    n = _jobs.next_model_index(f"agent-store/{run}/{restart}", rank)
    key = f"gradd/job_id/{run}/{restart}/{n}"
    from gradd import _torch_compat  # USE_LIBUV, and Debian's torch 2.6 without libuv

    store = _torch_compat.tcp_store(addr, int(port), is_master=False,
                                    timeout=datetime.timedelta(seconds=60))
    candidate = fresh_job_id()
    winner = store.compare_set(key, "", candidate)
    return winner.decode() if isinstance(winner, bytes) else str(winner)
