// The Python binding's join (uneven inputs: gradd._C.Client.join_enter,
// join_active, join, in_join) and bucket rebuild (rebuild_buckets,
// has_rebuilt_buckets, ready_order) on the client library's calls, with the
// GIL released while the ranks meet. Registered on the Client class by the
// module's init (gradd_module.cc), after the collectives.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradd/client.h"
#include "py_client.h"

namespace gradd::python {

void PyClient::JoinEnter(bool divide_by_initial_world_size,
                         bool throw_on_early_termination) {
  JoinOptions options;
  options.divide_by_initial_world_size = divide_by_initial_world_size;
  options.throw_on_early_termination = throw_on_early_termination;
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->JoinEnter(options);
  }
  Check(s);
}

void PyClient::JoinActive(const std::optional<py::buffer>& data) {
  void* ptr = nullptr;
  size_t bytes = 0;
  std::optional<py::buffer_info> info;
  if (data.has_value()) {
    info = data->request(/*writable=*/true);
    if (!PyBuffer_IsContiguous(reinterpret_cast<Py_buffer*>(info->view()),
                               'A')) {
      throw py::value_error("join_active needs a contiguous buffer");
    }
    ptr = info->ptr;
    bytes = static_cast<size_t>(info->size) * info->itemsize;
  }
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->JoinActive(ptr, bytes);
  }
  Check(s);
}

int PyClient::Join() {
  absl::StatusOr<JoinResult> r;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    r = client_->Join();
  }
  if (!r.ok()) RaiseStatus(r.status());
  return r->authoritative_rank;
}

bool PyClient::RebuildBuckets() {
  absl::StatusOr<bool> r;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    r = client_->RebuildBuckets();
  }
  Check(r.status());
  return *r;
}

void DefineJoinAndRebuild(py::class_<PyClient>& client) {
  client
      .def("join_enter", &PyClient::JoinEnter,
           py::arg("divide_by_initial_world_size") = true,
           py::arg("throw_on_early_termination") = false,
           "Enters join mode (uneven inputs) before the current iteration; "
           "every rank must do so before the same iteration.")
      .def("join_active", &PyClient::JoinActive, py::arg("sync") = py::none(),
           "This rank takes part in the current iteration (GIL released). "
           "`sync` (a writable contiguous buffer, same size on every rank) "
           "is replaced by the highest active rank's bytes. With "
           "throw_on_early_termination raises AbortedError if a rank ran "
           "out of inputs.")
      .def("join", &PyClient::Join,
           "This rank ran out of inputs: blocks (GIL released) until every "
           "rank joined; returns the authoritative global rank.")
      .def_property_readonly("in_join",
                             [](PyClient& c) { return c.client().in_join(); })
      .def("rebuild_buckets", &PyClient::RebuildBuckets,
           "Bucket rebuild (gradd::Client::RebuildBuckets): re-plans the "
           "buckets from the last completed iteration's ready order, on "
           "every rank at the same point (GIL released while the ranks "
           "meet). Returns whether it rebuilt; gradient(i) arrays made "
           "before a rebuild point at the old places.")
      .def_property_readonly(
          "has_rebuilt_buckets",
          [](PyClient& c) { return c.client().buckets_rebuilt(); })
      .def_property_readonly(
          "next_plan_switch",
          [](PyClient& c) { return c.client().next_plan_switch(); },
          "Autotune: the iteration after which every rank calls "
          "rebuild_buckets() again (0: none).")
      .def_property_readonly(
          "ready_order", [](PyClient& c) { return c.client().ready_order(); },
          "Parameter indices in the order they were marked ready in the "
          "last completed iteration (recorded until buckets are rebuilt).");
}

}  // namespace gradd::python
