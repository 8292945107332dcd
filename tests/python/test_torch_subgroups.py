"""DDP over ``process_group=dist.new_group(ranks)``: each subgroup is a
gradd job of exactly its ranks (divide factor = the subgroup's size), so
two data-parallel groups of 2 in a world of 4 (hybrid / model parallelism)
train side by side with torch's DDP's exact values over the same subgroups;
on one daemon, and across two daemons (each one "node") with subgroups that
span both."""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from spawn_util import clean_env, free_port, spawn
from torch_examples import TOL, ToyModel, checksum, init_gloo, seeded, train_side_by_side

STEPS = 4


def _worker(rank, world, port, sockets, coordinator, layouts):
    env = {"GRADD_SOCKET": sockets[rank]}
    if coordinator:
        env["GRADD_COORDINATOR"] = coordinator
    clean_env(env)
    init_gloo(rank, world, port)
    import gradd.torch

    out = {}
    for name, groups in layouts:
        pgs = [dist.new_group(g) for g in groups]  # every rank creates every group
        mine = next(i for i, g in enumerate(groups) if rank in g)
        model, twin = seeded(ToyModel, rank)
        ref = TorchDDP(model, process_group=pgs[mine])
        ours = gradd.torch.DistributedDataParallel(twin, process_group=pgs[mine])
        errs = train_side_by_side(ref, ours, STEPS, rank, salt=len(out))
        out[name] = {"errs": errs, "sum": checksum(ours.module), "group": mine,
                     "job": ours.job_id, "world": ours.world_size, "nodes": ours.num_nodes}
        ours.shutdown()
        dist.barrier()
    dist.destroy_process_group()
    return out


def _check(out, name, groups, nodes):
    for rank, r in enumerate(out):
        res = r[name]
        assert max(res["errs"]) <= TOL, f"rank {rank}: {res['errs']}"
        assert (res["world"], res["nodes"]) == (2, nodes), res
    for g in groups:
        assert len({out[r][name]["job"] for r in g}) == 1
        assert len({tuple(out[r][name]["sum"]) for r in g}) == 1, f"group {g} differs"
    jobs = {out[g[0]][name]["job"] for g in groups}
    assert len(jobs) == len(groups), f"subgroups share a job: {jobs}"
    # Different data per group: the groups' models differ (so each was
    # averaged over its own ranks only, as torch's were).
    assert out[groups[0][0]][name]["sum"] != out[groups[1][0]][name]["sum"]


def test_two_groups_of_two_on_one_daemon(daemon):
    groups = [[0, 1], [2, 3]]
    out = spawn(_worker, 4, (4, free_port(), [daemon.socket] * 4, None,
                             [("pairs", groups), ("interleaved", [[0, 2], [1, 3]])]),
                timeout=150)
    _check(out, "pairs", groups, 1)
    _check(out, "interleaved", [[0, 2], [1, 3]], 1)


def test_subgroups_across_two_daemons(two_daemons):
    # Ranks 0, 1 on node-a, 2, 3 on node-b; {0, 2} and {1, 3} span both
    # nodes (one trainer per node), {0, 1} and {2, 3} stay on one each.
    sockets = [two_daemons.nodes[r // 2].socket for r in range(4)]
    layouts = [("spanning", [[0, 2], [1, 3]]), ("per_node", [[0, 1], [2, 3]])]
    out = spawn(_worker, 4, (4, free_port(), sockets, two_daemons.coordinator, layouts),
                timeout=150)
    _check(out, "spanning", [[0, 2], [1, 3]], 2)
    _check(out, "per_node", [[0, 1], [2, 3]], 1)
