"""scripts/check-engine-includes: this checkout follows the engine's include
directions (observe <- formation <- reduce <- job <- manager), and the check
fails, naming file, line and components, on each kind of breach, shown on
small trees made here."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check-engine-includes"
COMPONENTS = ["observe", "formation", "reduce", "job", "manager"]


def run(repo):
    return subprocess.run([sys.executable, str(SCRIPT), str(repo)],
                          capture_output=True, text=True, timeout=60)


def make_tree(root, files, readmes=COMPONENTS):
    """A server/engine/ with a README.md in each of `readmes` and `files`
    ({path under server/engine/: [included paths]})."""
    engine = root / "server" / "engine"
    for component in readmes:
        (engine / component).mkdir(parents=True, exist_ok=True)
        (engine / component / "README.md").write_text("# " + component + "\n")
    for relative, includes in files.items():
        path = engine / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f'#include "{i}"\n' for i in includes) +
                        "namespace gradd {}\n")
    return root


def test_this_checkout_follows_the_rules():
    result = run(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_every_downward_include_passes(tmp_path):
    files = {}
    for i, component in enumerate(COMPONENTS):
        files[f"{component}/{component}_part.h"] = [
            f"server/engine/{below}/{below}_part.h"
            for below in COMPONENTS[:i]
        ] + ["absl/status/status.h", "common/shm.h", "gradd/v1/node.pb.h"]
    files["manager/uses_rpc.h"] = ["server/rpc/node_handler.h"]
    files["reduce/cuda/device.cc"] = ["server/engine/formation/x.h",
                                      "server/backends/nccl/nccl_library.h"]
    result = run(make_tree(tmp_path, files))
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_include_fails_naming_file_line_and_components(tmp_path):
    tree = make_tree(tmp_path, {
        "observe/timeline.h": ["absl/status/status.h",
                               "server/engine/observe/job_events.h",
                               "server/engine/job/job.h"],
    })
    result = run(tree)
    assert result.returncode == 1
    assert ("server/engine/observe/timeline.h:3: includes "
            "server/engine/job/job.h: observe/ may include only itself"
            in result.stdout)
    assert "not job/" in result.stdout
    assert len(result.stdout.splitlines()) == 1


def test_each_upward_pair_fails(tmp_path):
    files = {}
    for i, component in enumerate(COMPONENTS):
        files[f"{component}/up.cc"] = [
            f"server/engine/{above}/x.h" for above in COMPONENTS[i + 1:]
        ]
    result = run(make_tree(tmp_path, files))
    assert result.returncode == 1
    n = len(COMPONENTS)
    assert len(result.stdout.splitlines()) == n * (n - 1) // 2


def test_a_file_outside_the_component_folders_fails(tmp_path):
    tree = make_tree(tmp_path, {"loose.cc": [], "job/job.h": []})
    result = run(tree)
    assert result.returncode == 1
    assert "server/engine/loose.cc: not in a component folder" in result.stdout


def test_an_include_of_a_flat_engine_path_fails(tmp_path):
    tree = make_tree(tmp_path, {"job/job.cc": ["server/engine/job_events.h"]})
    result = run(tree)
    assert result.returncode == 1
    assert "server/engine/job/job.cc:1: includes server/engine/job_events.h, " \
        "which is in no component folder" in result.stdout


def test_an_unknown_component_folder_fails(tmp_path):
    tree = make_tree(tmp_path, {"misc/util.h": []})
    result = run(tree)
    assert result.returncode == 1
    assert "server/engine/misc/: not a component" in result.stdout
    assert "server/engine/misc/util.h: not in a component folder" \
        in result.stdout


def test_a_component_without_readme_fails(tmp_path):
    tree = make_tree(tmp_path, {"reduce/r.h": []},
                     readmes=["observe", "formation", "job", "manager"])
    result = run(tree)
    assert result.returncode == 1
    assert "server/engine/reduce/README.md: missing" in result.stdout


def test_including_what_is_built_on_the_engine_fails(tmp_path):
    tree = make_tree(tmp_path, {
        "job/a.cc": ["server/admin/admin_source.h"],
        "reduce/b.cc": ["server/metrics/daemon_metrics.h"],
        "formation/c.cc": ["server/auth/credentials.h"],
        "job/d.cc": ["server/rpc/node_handler.h"],
        "manager/e.cc": ["server/daemon.h"],
    })
    result = run(tree)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 5, result.stdout
    for path in ("job/a.cc:1", "reduce/b.cc:1", "formation/c.cc:1",
                 "job/d.cc:1", "manager/e.cc:1"):
        assert any(l.startswith("server/engine/" + path + ": includes")
                   for l in lines), (path, result.stdout)


def test_a_fake_beside_its_interface_passes_and_an_engine_file_using_it_fails(
        tmp_path):
    tree = make_tree(tmp_path, {
        "reduce/bucket_reducer.h": [],
        "reduce/fake_bucket_reducer.h": [
            "server/engine/reduce/bucket_reducer.h"],
    })
    assert run(tree).returncode == 0
    (tmp_path / "server/engine/job/job.cc").write_text(
        '#include "server/engine/reduce/fake_bucket_reducer.h"\n')
    result = run(tree)
    assert result.returncode == 1
    assert ("server/engine/job/job.cc:1: includes "
            "server/engine/reduce/fake_bucket_reducer.h: fake_*.h are test "
            "doubles" in result.stdout), result.stdout
    assert len(result.stdout.splitlines()) == 1, result.stdout


def test_what_the_engine_is_built_on_including_the_engine_fails(tmp_path):
    tree = make_tree(tmp_path, {"reduce/bucket_reducer.h": []})
    for relative in ("server/hooks/compress_hook.cc", "server/config.cc",
                     "server/backends/gloo/gloo_backend.cc",
                     "common/thread_pool.h"):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('#include "common/reduce.h"\n'
                        '#include "server/engine/reduce/bucket_reducer.h"\n')
    # The daemon's wiring is built on the engine: it may include it.
    (tmp_path / "server/daemon.cc").write_text(
        '#include "server/engine/reduce/bucket_reducer.h"\n')
    result = run(tree)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout
    for relative in ("server/hooks/compress_hook.cc", "server/config.cc",
                     "server/backends/gloo/gloo_backend.cc",
                     "common/thread_pool.h"):
        assert any(l.startswith(relative + ":2: includes server/engine/")
                   for l in lines), (relative, result.stdout)
