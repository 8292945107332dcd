"""Every DDP semantic, parity-tested: gradd.torch.DistributedDataParallel
against torch's own DistributedDataParallel (Gloo) on the same models, seeds
and per-rank data, comparing `grad is None` patterns, gradients, parameters
and buffers after every step (semantics_worker.py has the scenarios):

  unused          find_unused_parameters: parameters used on some ranks only,
                  used with an exactly-zero gradient, used by nobody; set_to_none,
                  zeroed and stale (not zeroed) gradients
  unused_stale    locally unused parameters with existing, rank-specific
                  gradients (from a local backward): contributed when somebody
                  used the parameter; a parameter used only in the local
                  backward counts as used, as in torch 2.x (torch 1.13 leaves
                  its ranks out of sync there; gradd keeps them identical and
                  the test expects torch 2.x's result)
  sync_rules      only backwards after a DDP forward sync: ddp.module(...)
                  backward on one rank only, uneven no_sync accumulation,
                  forwards never backpropagated, require_backward_grad_sync
  static          static_graph=True (and _set_static_graph()): a reused module,
                  the same parameters in two reentrant checkpoints, an unused
                  parameter
  twice_error     the same model without static_graph: torch's "marked ready
                  twice" error
  gan             two DDP models in one process (own derived job ids)
  buffers         parameters (frozen too) and named_buffers (non-persistent too)
                  from rank 0 at construction, buffers before each forward
  logging         _get_ddp_logging_data keys, types and values

with 2 and 3 ranks on one daemon and 2 daemons x 2 ranks (a multi-node job).
Every scenario fails if gradd skips the averaging (its gradients would be the
local ones, which differ per rank).
"""
import json

import pytest

from conftest import run_workers

STEPS = 5
ALL = ["unused", "unused_stale", "sync_rules", "sync_rules_view", "static", "static_setter", "gan",
       "buffers", "buffers_off", "logging", "twice_error"]


def check(outs, names):
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    failures = [f for r in results for s in r["results"] for f in s["failures"]]
    assert not failures, "\n".join(failures)
    for k, name in enumerate(names):
        per_rank = [r["results"][k] for r in results]
        assert all(s["scenario"] == name and s["checks"] > 0 for s in per_rank), per_rank
        # gradd's ranks end with the same model.
        sums = [s["checksum"] for s in per_rank]
        assert all(c == sums[0] for c in sums), f"{name}: ranks differ: {sums}"


def run(names, world, tmp_path, env, rank_env=None, timeout=240):
    outs = run_workers("semantics_worker.py", world,
                       [",".join(names), str(tmp_path / "gloo_init"), str(STEPS)],
                       env, timeout=timeout, rank_env=rank_env)
    check(outs, names)


@pytest.mark.parametrize("scenario", ALL)
def test_two_ranks(daemon, job_id, tmp_path, scenario):
    run([scenario], 2, tmp_path, {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id})


def test_three_ranks(daemon, job_id, tmp_path):
    run(ALL, 3, tmp_path, {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id})


def test_two_daemons_two_ranks_each(two_daemons, job_id, tmp_path):
    run(ALL, 4, tmp_path, {"GRADD_JOB": job_id},
        rank_env=lambda r: two_daemons.rank_env(r, 2))
