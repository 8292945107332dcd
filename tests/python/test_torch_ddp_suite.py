"""torch's own DDP tests, with torch's DDP and with gradd's swapped in.

Under torch 1.13 (Debian 12) and torch 2.6 (Debian 13, scripts/debian13):
one source, the lists of what torch itself skips kept per torch major
version where torch's tests differ (see below).

torch/testing/_internal/distributed/distributed_test.py (shipped by Debian's
python3-torch) holds the tests torch's CI runs against its
DistributedDataParallel. torch_suite_runner.py runs every test of its
``_DistTestBase`` that constructs a DDP (directly or through a
``self._helper``) on Gloo, the way torch's test_distributed_spawn.py does:
one process per rank, ``init_process_group`` with a file:// store, nothing
else. For each world size here it runs them once with torch's DDP and once
with ``gradd.torch.DistributedDataParallel`` in its place (patched into
``torch.nn.parallel`` and distributed_test's own import), against a daemon
this test starts; the only gradd-specific variable the ranks get is
GRADD_SOCKET.

Asserted:
  * under torch, every selected test passes or is skipped for a reason
    listed below (SKIPPED_NEED_CUDA / SKIPPED_NEED_NCCL); anything else means
    the harness is broken, not gradd;
  * every test that passes under torch passes under gradd, except the
    entries of KNOWN_FAILURES (each a failure seen under gradd, with its
    cause); an entry that passes fails this test, so the list only shrinks;
  * under gradd, every rank process of every test constructed gradd's DDP
    (the swap took effect), and the daemon survives the whole run.

Time: the rank processes are forked (see torch_suite_runner.py); the whole
file takes about 1-2 minutes on two cores, under either torch. GRADD_TORCH_SUITE_WORLDS (e.g.
"2") restricts the world sizes; GRADD_TORCH_SUITE_TESTS (comma-separated
names) restricts the tests, for a quick loop by hand.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

import gradd.torch  # noqa: F401  (what the rank processes swap in; fail here if broken)
from conftest import HERE, Daemon

RUNNER = os.path.join(HERE, "torch_suite_runner.py")
WORLD_SIZES = [
    int(w) for w in os.environ.get("GRADD_TORCH_SUITE_WORLDS", "2,3").split(",") if w.strip()
]

TORCH_MAJOR = int(torch.__version__.split(".")[0])

# Skipped under torch by torch's own harness on this machine (Debian's torch
# is CPU-only and built without NCCL). They need one (or 2, WORLD_SIZE, 4)
# CUDA devices: the harness exits the rank processes with "CUDA is not
# available." or "Need at least N CUDA devices". (torch 1.13's list; torch
# 2's is derived from it below.)
SKIPPED_NEED_CUDA = frozenset("""
    test_DistributedDataParallel
    test_DistributedDataParallel_SyncBatchNorm
    test_DistributedDataParallel_SyncBatchNorm_2D_Input
    test_DistributedDataParallel_SyncBatchNorm_Channels_Last
    test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_Running_Value
    test_DistributedDataParallel_SyncBatchNorm_Diff_Input_Sizes_gradient
    test_DistributedDataParallel_SyncBatchNorm_No_Affine
    test_DistributedDataParallel_SyncBatchNorm_Single_Input_Per_Process
    test_DistributedDataParallel_non_default_stream
    test_DistributedDataParallel_with_amp_and_grad_is_view
    test_DistributedSampler_padding
    test_ddp_broadcast_buffer
    test_ddp_broadcast_buffer_via_hook
    test_ddp_buffer_hook_allreduce
    test_ddp_buffer_hook_allreduce_return_future
    test_ddp_build_debug_param_to_name_mapping_requires_grad
    test_ddp_comm_hook_logging
    test_ddp_grad_div_uneven_inputs
    test_ddp_hook_parity_allreduce
    test_ddp_hook_parity_allreduce_process_group
    test_ddp_hook_parity_post_localSGD
    test_ddp_hook_parity_powerSGD
    test_ddp_hook_pickling_powerSGD
    test_ddp_hook_with_optimizer_parity_adam_optimize_subset_False
    test_ddp_hook_with_optimizer_parity_adam_optimize_subset_True
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_False_static_graph_False_optimize_subset_False
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_False_static_graph_False_optimize_subset_True
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_False_static_graph_True_optimize_subset_False
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_False_static_graph_True_optimize_subset_True
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_True_static_graph_False_optimize_subset_False
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_True_static_graph_False_optimize_subset_True
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_True_static_graph_True_optimize_subset_False
    test_ddp_hook_with_optimizer_parity_adamw_grad_as_bucket_view_True_static_graph_True_optimize_subset_True
    test_ddp_hook_with_optimizer_parity_sgd_optimize_subset_False
    test_ddp_hook_with_optimizer_parity_sgd_optimize_subset_True
    test_ddp_inference
    test_ddp_join_model_equivalence
    test_ddp_logging_data_gpu
    test_ddp_new_tensor_in_fwd
    test_ddp_new_tensor_in_fwd_static_graph
    test_ddp_python_error_logged
    test_ddp_returns_tensor_with_no_grad
    test_ddp_static_graph_nested_types
    test_ddp_sync_bn_training_vs_eval
    test_ddp_sync_module_states
    test_ddp_uneven_input_exception
    test_ddp_uneven_input_join_disable
    test_ddp_uneven_inputs
    test_ddp_uneven_inputs_stop_iteration_sync_bn
    test_detect_ddp_is_actually_static
    test_output_unused_in_loss_dict_module
    test_output_unused_in_loss_tuple_module
    test_post_localSGD_optimizer_parity
    test_post_localSGD_optimizer_parity_grad_is_view
    test_post_localSGD_optimizer_parity_with_hierarchical_sgd
    test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view
    test_post_localSGD_optimizer_step_reload
    test_stateless_api_with_ddp
    test_sync_bn_logged
    test_undefined_grad_parity_unused_parameters
""".split())
CUDA_SKIP = re.compile(r"^(CUDA is not available\.|Need at least \d+ CUDA devices)$")

# Skipped under torch because torch was built without NCCL: they are marked
# @require_backends_available({"gloo", "nccl"}), skipped unless both are
# compiled in. Every one of them also needs 2 CUDA devices
# (@skip_if_lt_x_gpu(2); seen by lifting that mark), so they would not run
# on this machine's CPU-only torch either way.
SKIPPED_NEED_NCCL = frozenset("""
    test_compute_bucket_assignment_by_size_sparse_error_with_logger
    test_compute_bucket_assignment_by_size_sparse_error_without_logger
    test_ddp_build_debug_param_to_name_mapping
    test_ddp_control_flow_different_across_ranks
    test_ddp_control_flow_same_across_ranks
    test_ddp_device
    test_ddp_forward_backward_hook
    test_ddp_ignore_params_arg
    test_ddp_model_diff_num_params_across_ranks
    test_ddp_model_diff_shape_across_ranks
    test_ddp_multiple_nested_unused_params_err_ignore_params
    test_ddp_multiple_nested_unused_params_error
    test_ddp_namedtuple
    test_ddp_profiling_autograd_profiler
    test_ddp_profiling_torch_profiler
    test_ddp_shared_grad_acc_unused_params
    test_ddp_unused_params_rebuild_buckets_exception
    test_different_graph_across_ranks
    test_invalid_static_graph
    test_verify_model_across_rank_with_logger
    test_verify_model_across_rank_without_logger
""".split())
NCCL_SKIP = re.compile(r"^Test requires backends to be available \{'(nccl|gloo)', '(nccl|gloo)'\}$")

# Skipped outright by torch's own decorators, whatever the machine: test ->
# the reason torch gives (none under torch 1.13).
SKIPPED_BY_TORCH = {}

if TORCH_MAJOR >= 2:
    # torch 2.6's distributed_test.py (Debian 13's python3-torch; the same at
    # 2 and 3 ranks). Its NCCL tests check the GPU count before the
    # backends, so they skip as needing CUDA; it adds CUDA-only tests; the
    # 12 test_ddp_hook_with_optimizer_parity_* are commented out; and five
    # tests are skipped outright (each also needs >= 2 CUDA devices).
    SKIPPED_BY_TORCH = {
        "test_ddp_has_finalized":
            "Test is failing, tracking issue at https://github.com/pytorch/pytorch/issues/102751",
        "test_ddp_hook_pickling_powerSGD": "Skipped due to flakiness",
        "test_ddp_profiling_autograd_profiler": "Currently failing in NVIDIA internal CI",
        "test_ddp_profiling_execution_trace": "Tests nccl metadata primarily.",
        "test_ddp_sync_bn_training_vs_eval":
            "Test is failing, see https://github.com/pytorch/pytorch/pull/113620",
    }
    _NEW_NEED_CUDA = frozenset("""
        test_DistributedDataParallel_SyncBatchNorm_half
        test_ddp_apply_optim_in_backward
        test_ddp_apply_optim_in_backward_grad_as_bucket_view_false
        test_ddp_apply_optim_in_backward_ignored_params
        test_ddp_compile_static_graph
        test_ddp_device_mesh_initialization
        test_ddp_native_mixed_precision_grad_as_bucket_view_no_set_grad_none
        test_ddp_native_mixed_precision_grad_as_bucket_view_set_grad_to_none
        test_ddp_native_mixed_precision_ignored_params
        test_ddp_native_mixed_precision_no_grad_as_bucket_view_no_set_grad_none
        test_ddp_native_mixed_precision_no_grad_as_bucket_view_set_grad_to_none
        test_ddp_remove_autograd_hooks
        test_ddp_sink_noclone
        test_ddp_zero_output_features
        test_get_data_parallel_params
        test_static_graph_multi_forward
    """.split())
    SKIPPED_NEED_CUDA = frozenset(
        n for n in SKIPPED_NEED_CUDA | SKIPPED_NEED_NCCL | _NEW_NEED_CUDA
        if n not in SKIPPED_BY_TORCH
        and not n.startswith("test_ddp_hook_with_optimizer_parity_")
    )
    SKIPPED_NEED_NCCL = frozenset()

# Tests that pass under torch and fail under gradd: (test, world size) ->
# the cause in gradd, then the error's first line as seen. Remove an entry
# when its fix lands (this test fails while a listed test passes).
# Empty under torch 1.13 and 2.6: every test that passes under torch here
# passes under gradd. A failure seen later goes here as
# {(test, world): "cause; first error line"}, in its torch version's dict.
KNOWN_FAILURES = {1: {}, 2: {}}[TORCH_MAJOR]

# Variables of the calling environment the ranks must not see: torch's
# harness gives them none of these, and gradd gets nothing but its socket.
_SCRUBBED = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "INIT_METHOD", "TORCH_DISTRIBUTED_DEBUG")


def _run_suite(impl, world, tests, socket=None, timeout=900):
    """Runs torch_suite_runner.py once; returns its results by test."""
    with tempfile.TemporaryDirectory(prefix=f"gradd-torch-suite-{impl}{world}-") as tmp:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED and not (k.startswith("GRADD_") and k != "GRADD_BINARY")
        }
        env.update(
            BACKEND="gloo",
            WORLD_SIZE=str(world),
            TEMP_DIR=os.path.join(tmp, "temp"),
            GRADD_TORCH_SUITE_IMPL=impl,
            # Bounds for a hanging test (each takes about a second under
            # torch): per test, and for the run, within ctest's timeout.
            GRADD_TORCH_SUITE_TIMEOUT="60",
            GRADD_TORCH_SUITE_BUDGET="300",
            OMP_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
        )
        if socket is not None:
            env["GRADD_SOCKET"] = socket
        os.makedirs(env["TEMP_DIR"])
        out_path = os.path.join(tmp, "results.json")
        proc = subprocess.run(
            [sys.executable, RUNNER, "--out", out_path, "--log-dir", os.path.join(tmp, "logs"),
             *tests],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
        output = proc.stdout.decode(errors="replace")
        assert proc.returncode == 0 and os.path.exists(out_path), (
            f"torch_suite_runner ({impl}, world {world}) exited {proc.returncode}:\n"
            f"{output[-8000:]}"
        )
        with open(out_path) as f:
            return json.load(f)


def _selected_tests():
    env = dict(os.environ, BACKEND="gloo", WORLD_SIZE="2")
    with tempfile.TemporaryDirectory(prefix="gradd-torch-suite-list-") as tmp:
        env["TEMP_DIR"] = tmp
        out = subprocess.run(
            [sys.executable, RUNNER, "--list"], env=env, check=True, stdout=subprocess.PIPE,
            timeout=300,
        ).stdout.decode()
    return out.split()


@pytest.fixture(scope="module")
def selected():
    tests = _selected_tests()
    only = [t for t in os.environ.get("GRADD_TORCH_SUITE_TESTS", "").split(",") if t]
    return tests, (only or tests)


def test_selection_covers_torch_ddp_tests(selected):
    """The runner finds torch's DDP tests, direct and through helpers, and
    every one it finds is accounted for here."""
    tests, _ = selected
    assert "test_DistributedDataParallelCPU" in tests  # constructs DDP itself
    assert "test_accumulate_gradients_no_sync" in tests  # through a helper
    assert "test_get_rank" not in tests  # no DDP
    assert len(tests) >= 80, tests
    listed = SKIPPED_NEED_CUDA | SKIPPED_NEED_NCCL | set(SKIPPED_BY_TORCH)
    assert not listed - set(tests), f"listed but not selected: {sorted(listed - set(tests))}"


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_torch_ddp_suite_under_gradd(world, selected, gradd_binary):
    _, tests = selected
    torch_results = _run_suite("torch", world, tests)

    # Under torch: passed, or skipped for a listed reason.
    runnable = []
    unexpected = []
    for name in tests:
        r = torch_results[name]
        if r["status"] == "passed":
            runnable.append(name)
        elif r["status"] == "skipped" and name in SKIPPED_NEED_CUDA and CUDA_SKIP.match(r["reason"]):
            pass
        elif r["status"] == "skipped" and name in SKIPPED_NEED_NCCL and NCCL_SKIP.match(r["reason"]):
            pass
        elif r["status"] == "skipped" and SKIPPED_BY_TORCH.get(name) == r["reason"]:
            pass
        else:
            unexpected.append(f"{name}: {r['status']}: {r['reason']}\n{r['detail'][-3000:]}")
    assert not unexpected, "under torch's own DDP:\n" + "\n".join(unexpected)
    print(f"torch {torch.__version__}, world {world}: under torch's DDP "
          f"{len(runnable)} passed, {len(tests) - len(runnable)} skipped")
    if not runnable:
        pytest.skip(f"no selected test runs under torch at world {world}")

    # Under gradd: what passed under torch, against a daemon of our own.
    daemon = Daemon(gradd_binary)
    try:
        gradd_results = _run_suite("gradd", world, runnable, socket=daemon.socket)
        alive, log = daemon.proc.poll() is None, daemon.log()
    finally:
        daemon.stop()

    table = "\n".join(
        f"  {n} (world {world}): {gradd_results[n]['status']} {gradd_results[n]['reason']}"
        for n in runnable
    )
    print(f"torch's DDP tests under gradd, world {world}:\n{table}")
    new_failures, fixed = [], []
    for name in runnable:
        r = gradd_results[name]
        # A pass counts only if the swap took effect: every rank
        # constructed gradd's DDP.
        assert r["status"] != "passed" or r["gradd_ddps"] >= world, (
            f"{name} (world {world}) passed, constructing {r['gradd_ddps']} gradd "
            f"DistributedDataParallel in its {world} rank processes"
        )
        known = (name, world) in KNOWN_FAILURES
        if r["status"] != "passed" and not known:
            new_failures.append(f"{name}: {r['status']}: {r['reason']}\n{r['detail'][-4000:]}")
        elif r["status"] == "passed" and known:
            fixed.append(name)
    passed = sum(gradd_results[n]["status"] == "passed" for n in runnable)
    print(f"torch {torch.__version__}, world {world}: under gradd's DDP {passed} passed, "
          f"{sum((n, world) in KNOWN_FAILURES for n in runnable)} known failures")
    assert alive, f"gradd died while torch's DDP tests ran:\n{log}"
    assert not new_failures, (
        f"passed under torch, not under gradd (world {world}):\n" + "\n".join(new_failures)
        + f"\n--- daemon log\n{log}"
    )
    assert not fixed, (
        f"now pass under gradd at world {world}; remove them from KNOWN_FAILURES: {fixed}"
    )
