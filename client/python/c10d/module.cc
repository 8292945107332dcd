// gradd._c10d: ProcessGroupGradd for Python (a subclass of torch's
// torch.distributed.ProcessGroup on torch 1.13, of its c10d Backend on torch
// 2.x: see torch_compat.h), created by gradd/distributed.py's backend
// creator once the ranks agreed on a job through torch's store.
//
// Importing it under a torch other than the one it was built against (major
// and minor version) raises ImportError before any torch class is touched:
// torch's C++ classes change layout between versions, so the extension would
// crash rather than fail.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "gradd/client.h"
#include "process_group_gradd.h"
#include "torch_compat.h"

namespace py = pybind11;

namespace gradd::c10d_backend {
namespace {

c10::intrusive_ptr<ProcessGroupGradd> Create(
    int rank, int size, const std::string& job_id, const std::string& socket,
    int local_rank, int local_world_size, int node_rank, int num_nodes,
    const std::string& coordinator, double timeout_s, size_t collective_bytes) {
  gradd::ClientOptions o;
  o.socket_path = socket;
  o.job_id = job_id;
  o.local_rank = local_rank;
  o.local_world_size = local_world_size;
  o.num_nodes = num_nodes;
  o.node_rank = node_rank;
  o.coordinator = coordinator;
  // Given explicitly so that the launcher's WORLD_SIZE / RANK (the default
  // group's) are never checked against a subgroup's job.
  o.world_size = size;
  o.rank = rank;
  o.collective_bytes = collective_bytes;
  o.broadcast_bytes = size_t{4} << 20;
  o.rebuild_buckets = false;
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  if (timeout.count() > 0) {
    o.attach_timeout = timeout;
    o.wait_timeout = timeout;
  }
  absl::StatusOr<std::unique_ptr<gradd::Client>> client;
  {
    py::gil_scoped_release release;
    client = gradd::Client::Attach(o, {});
  }
  if (!client.ok()) {
    throw std::runtime_error("gradd backend: attaching group rank " +
                             std::to_string(rank) + " of " +
                             std::to_string(size) + " to job '" + job_id +
                             "' failed: " + client.status().ToString());
  }
  if ((*client)->global_rank() != rank || (*client)->world_size() != size) {
    throw std::runtime_error("gradd backend: job '" + job_id +
                             "' placed group rank " + std::to_string(rank) +
                             " of " + std::to_string(size) + " at gradd rank " +
                             std::to_string((*client)->global_rank()) + " of " +
                             std::to_string((*client)->world_size()));
  }
  return c10::make_intrusive<ProcessGroupGradd>(std::move(*client), job_id);
}

// Throws ImportError unless the running torch's major.minor version is the
// one this extension was built against.
void CheckTorchVersion() {
  const std::string built = std::to_string(TORCH_VERSION_MAJOR) + "." +
                            std::to_string(TORCH_VERSION_MINOR) + ".";
  const std::string running =
      py::str(py::module_::import("torch").attr("__version__"));
  if (running.compare(0, built.size(), built) != 0) {
    throw py::import_error(
        "gradd._c10d was built against torch " + std::string(TORCH_VERSION) +
        " but torch " + running +
        " is running; rebuild gradd's Python client (scripts/setup) with "
        "this torch's libtorch-dev");
  }
  if (!py::module_::import("torch.distributed")
           .attr("is_available")()
           .cast<bool>()) {
    throw py::import_error(
        "gradd._c10d: this torch is built without torch.distributed");
  }
}

}  // namespace
}  // namespace gradd::c10d_backend

PYBIND11_MODULE(_c10d, m) {
  using gradd::c10d_backend::ProcessGroupGradd;
  m.doc() = "gradd's torch.distributed process group (backend \"gradd\")";
  gradd::c10d_backend::CheckTorchVersion();
  // Registers torch's ProcessGroup / Backend type with pybind11 first.
  namespace compat = gradd::c10d_backend::compat;
  py::object base = py::module_::import(compat::kPythonBaseModule)
                        .attr(compat::kPythonBaseClass);
  py::class_<ProcessGroupGradd, c10::intrusive_ptr<ProcessGroupGradd>>(
      m, "ProcessGroupGradd", base)
      .def_property_readonly("job_id", &ProcessGroupGradd::job_id);
  // The torch built against, and whether ProcessGroupGradd is a c10d
  // Backend under torch's own ProcessGroup (2.x) or the group itself
  // (1.13): for diagnostics and tests.
  m.attr("TORCH_VERSION") = TORCH_VERSION;
  m.attr("IS_BACKEND") = TORCH_VERSION_MAJOR >= 2;
  m.def("create", &gradd::c10d_backend::Create, py::arg("rank"),
        py::arg("size"), py::kw_only(), py::arg("job_id"), py::arg("socket"),
        py::arg("local_rank"), py::arg("local_world_size"),
        py::arg("node_rank"), py::arg("num_nodes"), py::arg("coordinator"),
        py::arg("timeout") = 0.0, py::arg("collective_bytes") = 0,
        "Attaches a collective-only gradd client for group rank `rank` of "
        "`size` and returns the process group over it (blocks until every "
        "local rank attached). Raises RuntimeError with gradd's message.");
}
