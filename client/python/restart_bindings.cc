// The Python binding's rank restart calls (gradd._C.Client.restarted,
// rank_restart_grace_ms, iterations_aborted, restarts, state_sync_pending,
// begin_state_sync; client/include/gradd/client.h "Rank restart"), and
// gradd._C._raise_status, which raises what a status maps to (the tests of
// the error mapping, errors.cc). Registered on the Client class by the
// module's init (gradd_module.cc).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "gradd/client.h"
#include "py_client.h"

namespace gradd::python {

int PyClient::BeginStateSync() {
  absl::StatusOr<int> root;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    root = client_->BeginStateSync();
  }
  if (!root.ok()) RaiseStatus(root.status());
  return *root;
}

void DefineRankRestart(py::module_& m, py::class_<PyClient>& client) {
  client
      .def_property_readonly(
          "restarted", [](PyClient& c) { return c.client().restarted(); },
          "True when this attach re-attached a restarted rank to its running "
          "job (rank_restart_grace_ms > 0); its first iteration is then "
          "`iteration`, past 1.")
      .def_property_readonly(
          "rank_restart_grace_ms",
          [](PyClient& c) { return c.client().rank_restart_grace_ms(); },
          "The grace the job runs with, in milliseconds (0: none; a dead "
          "rank fails the job at once).")
      .def_property_readonly(
          "iterations_aborted",
          [](PyClient& c) { return c.client().iterations_aborted(); },
          "Iterations aborted by rank restarts since this rank attached.")
      .def_property_readonly(
          "restarts", [](PyClient& c) { return c.client().restarts(); },
          "Restarted ranks re-attached to the job so far (the daemon's "
          "count).")
      .def_property_readonly(
          "min_nodes", [](PyClient& c) { return c.client().min_nodes(); },
          "The job's min_nodes as the daemon answered (0: not elastic; a "
          "lost node fails the job).")
      .def_property_readonly(
          "live_world_size",
          [](PyClient& c) { return c.client().live_world_size(); },
          "Global ranks taking part now (world_size until a node of the job "
          "is lost or added).")
      .def_property_readonly(
          "epoch", [](PyClient& c) { return c.client().epoch(); },
          "Re-formations of the job's inter-node group so far.")
      .def_property_readonly(
          "state_behind", [](PyClient& c) { return c.client().state_behind(); },
          "The last re-formation found this rank's node one iteration behind "
          "and it has not synced since: it loads the state the next sync "
          "broadcasts, like a restarted rank.")
      .def(
          "state_sync_pending",
          [](PyClient& c) { return c.client().StateSyncPending(); },
          "True when a state sync is due before this rank's next iteration "
          "(a rank restarted since this rank last synced, or this rank "
          "restarted and has not synced yet). Every rank of the job sees the "
          "same at the same point of its iteration sequence.")
      .def("begin_state_sync", &PyClient::BeginStateSync,
           "Collective: the state sync's root, the lowest global rank that "
           "holds the job's state, and marks the sync handled; then "
           "broadcast the state from it (broadcast(data, root)). Blocks "
           "(GIL released). FailedPreconditionError when no rank holds the "
           "state; IterationAbortedError when another restart aborted it "
           "(call it again).");

  m.def(
      "_raise_status",
      [](const std::string& code, const std::string& message,
         bool iteration_aborted) {
        absl::StatusCode c = absl::StatusCode::kUnknown;
        bool found = false;
        for (int i = 1; i <= 16; ++i) {
          const auto candidate = static_cast<absl::StatusCode>(i);
          if (absl::StatusCodeToString(candidate) == code) {
            c = candidate;
            found = true;
            break;
          }
        }
        if (!found) throw py::value_error("unknown status code '" + code + "'");
        absl::Status status(c, message);
        if (iteration_aborted) {
          status.SetPayload(kIterationAbortedPayload, absl::Cord("1"));
        }
        RaiseStatus(status);
      },
      py::arg("code"), py::arg("message"), py::arg("iteration_aborted") = false,
      "For tests: raises what a status of `code` (e.g. 'ABORTED') with "
      "`message` maps to; iteration_aborted=True adds the payload "
      "gradd::kIterationAbortedPayload.");
}

}  // namespace gradd::python
