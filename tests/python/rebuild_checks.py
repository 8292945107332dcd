"""What the bucket-rebuild parity tests check of rebuild_worker.py's results
(test_rebuild.py on CPU, test_cuda_ddp.py on GPU): gradients and parameters
equal to torch's DDP after every step, the rebuild at the same forward as
torch's, torch's rebuilt buckets and logging fields, every .grad in gradd's
shared memory, the same model on every rank."""
import json

STEPS = 5
TOL = 1e-5


def results(outs):
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def torch_buckets(r):
    sizes = [int(s) for s in r["torch_sizes"].split(",")]
    params = [[int(i) for i in b.split()] for b in r["torch_params"].split(",")]
    return sizes, params


def check(rs, rebuild_at):
    for r in rs:
        for step, err in enumerate(r["per_step"]):
            assert err <= TOL, f"rank {r['rank']} step {step}: relative error {err}"
        # Rebuilt at the same forward as torch (both flags per step).
        want = [step >= rebuild_at for step in range(STEPS)] if rebuild_at is not None else [False] * STEPS
        assert [t for t, _ in r["rebuilt"]] == want, r["rebuilt"]
        assert [o for _, o in r["rebuilt"]] == want, r["rebuilt"]
        assert r["client_rebuilt"] == (rebuild_at is not None)
        assert r["grads_in_shared_memory"]
        if rebuild_at is not None:
            sizes, params = torch_buckets(r)
            assert r["ours_sizes"] == sizes
            assert r["ours_params"] == params
            assert r["ours_params"] != r["initial_plan"], "the test model must change the plan"
            # The same fields, in torch's own logging format.
            assert r["ours_log"] == r["torch_log"]
        else:
            assert r["ours_params"] == r["initial_plan"]
            assert r["ours_log"] == {"has_rebuilt_buckets": 0}
    assert len({r["checksum"] for r in rs}) == 1, "ranks hold different models"
