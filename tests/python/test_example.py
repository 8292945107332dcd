"""examples/pytorch/train.py launched as a user would (torchrun's variables)."""
import os
import re

from conftest import HERE, run_workers


def test_example_trains_and_ranks_agree(daemon, tmp_path):
    example = os.path.join(HERE, "..", "..", "examples", "pytorch", "train.py")
    outs = run_workers(
        os.path.abspath(example),
        2,
        ["--steps", "40"],
        {"GRADD_SOCKET": daemon.socket, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
    )
    sums = [re.search(r"parameter checksum (\S+)", o).group(1) for o in outs]
    assert sums[0] == sums[1]
    losses = [float(x) for x in re.findall(r"loss (\S+)", outs[0])]
    assert len(losses) >= 2 and losses[-1] < losses[0] * 0.7, losses
    assert "job torch-127.0.0.1:29555: 2 ranks" in outs[0]


def test_example_restart_safe_loop_trains_as_the_plain_one(daemon, job_id):
    """--restart-safe (register_state, sync_state, the retry loop) with no
    restart trains exactly as the plain loop: same data per step, same
    final parameters."""
    example = os.path.abspath(os.path.join(HERE, "..", "..", "examples", "pytorch", "train.py"))
    sums = {}
    for flag in ("plain", "restart-safe"):
        args = ["--steps", "30"] + (["--restart-safe"] if flag == "restart-safe" else [])
        outs = run_workers(example, 2, args,
                           {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": f"{job_id}-{flag}"})
        got = [re.search(r"parameter checksum (\S+)", o).group(1) for o in outs]
        assert got[0] == got[1]
        sums[flag] = got[0]
        assert "step    1  loss" in outs[0] and "step   20  loss" in outs[0]
    assert sums["plain"] == sums["restart-safe"]
