"""Which group a trainer-side communication hook gets (gradd/_hook_group.py)
beyond the default group (tests/python/test_user_hooks.py): a DDP over a
subgroup whose hook's state is that subgroup gets the gradd group of the
subgroup's job (same ranks, same rank numbers); a world whose ranks are
placed interleaved across two daemons (so the job's rank numbers differ
from the group's) keeps the user's Gloo group. torch's DDP with the same
hook over the same groups alongside, values compared after every step."""
import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.distributed
from spawn_util import clean_env, free_port, spawn
from torch_examples import TOL, ToyModel, checksum, init_gloo, seeded, train_side_by_side
from user_hook_worker import allreduce_then_divide

STEPS = 3

pytestmark = pytest.mark.skipif(
    not gradd.distributed.available(),
    reason="gradd._c10d not built (libtorch-dev missing): hooks use the user's groups",
)


def _worker(rank, world, port, sockets, coordinator, groups):
    env = {"GRADD_SOCKET": sockets[rank]}
    if coordinator:
        env["GRADD_COORDINATOR"] = coordinator
    clean_env(env)
    init_gloo(rank, world, port)
    import gradd.torch

    if groups is None:
        pg = None
    else:
        pgs = [dist.new_group(g) for g in groups]  # every rank creates every group
        pg = pgs[next(i for i, g in enumerate(groups) if rank in g)]
    seen = []

    def recording(state, bucket):
        """What the hook got: its type, and for a group its backend, whether
        dist.get_rank answers the DDP group's rank, its size."""
        note = ["None"] if state is None else [
            type(state).__name__, dist.get_backend(state),
            dist.get_rank(state) == dist.get_rank(pg), dist.get_world_size(state)]
        if note not in seen:
            seen.append(note)
        return allreduce_then_divide(state, bucket)

    model, twin = seeded(ToyModel, rank)
    ref = TorchDDP(model, process_group=pg)
    ours = gradd.torch.DistributedDataParallel(twin, process_group=pg)
    # The subgroup's DDP: its group as the state; the world's: None.
    ref.register_comm_hook(ref.process_group if pg is not None else None, allreduce_then_divide)
    ours.register_comm_hook(ours.process_group if pg is not None else None, recording)
    errs = train_side_by_side(ref, ours, STEPS, rank)
    out = {"errs": errs, "sum": checksum(ours.module), "seen": seen, "job": ours.job_id}
    ours.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    return out


def test_subgroup_hook_gets_the_subgroups_gradd_group(daemon):
    groups = [[0, 2], [1, 3]]  # group ranks differ from global ranks
    out = spawn(_worker, 4, (4, free_port(), [daemon.socket] * 4, None, groups), timeout=180)
    for rank, r in enumerate(out):
        assert max(r["errs"]) <= TOL, f"rank {rank}: {r['errs']}"
        assert r["seen"] == [["HookProcessGroup", "gradd", True, 2]], r["seen"]
    for g in groups:
        assert len({tuple(out[r]["sum"]) for r in g}) == 1, f"group {g} differs"
    assert out[0]["sum"] != out[1]["sum"]  # each group averaged on its own


def test_interleaved_placement_keeps_the_users_group(two_daemons):
    # Ranks 0, 2 on node-a and 1, 3 on node-b: the daemons number the job's
    # ranks node by node (0, 1 on node-a), the default group does not, so
    # the gradd group would not be the same group: the hook keeps None.
    sockets = [two_daemons.nodes[r % 2].socket for r in range(4)]
    out = spawn(_worker, 4, (4, free_port(), sockets, two_daemons.coordinator, None),
                timeout=180)
    for rank, r in enumerate(out):
        assert max(r["errs"]) <= TOL, f"rank {rank}: {r['errs']}"
        assert r["seen"] == [["None"]], r["seen"]
    assert len({tuple(r["sum"]) for r in out}) == 1
