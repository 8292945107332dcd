// gradd._C's Client (PyClient) and what the binding's files share
// (gradd_module.cc, the module's init; errors.cc; collective_bindings.cc;
// join_rebuild_bindings.cc; restart_bindings.cc).
//
// A PyClient owns one gradd::Client. Threads: mark_ready may run on several
// threads at once (autograd threads); it releases the GIL. wait_all,
// broadcast, the collectives, join, rebuild and attach block and release the
// GIL; they are serialised by call_mu_ because the client library allows one
// caller at a time for everything but MarkReady.
#ifndef GRADD_CLIENT_PYTHON_PY_CLIENT_H_
#define GRADD_CLIENT_PYTHON_PY_CLIENT_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gradd/client.h"

namespace py = pybind11;

namespace gradd::python {

// errors.cc: gradd.GraddError and its per-code subclasses on `m` (once, at
// module init; before anything raises).
void RegisterErrors(py::module_& m);
// Raises the GraddError subclass for status's code (status must not be OK).
[[noreturn]] void RaiseStatus(const absl::Status& status);
// RaiseStatus unless OK.
void Check(const absl::Status& status);
// Raises InvalidArgumentError (also a ValueError) with `message`.
[[noreturn]] void RaiseInvalid(const std::string& message);

class PyClient {
 public:
  PyClient(std::unique_ptr<Client> client, std::vector<ClientParam> params)
      : client_(std::move(client)), params_(std::move(params)) {}

  ~PyClient() {
    // The destructor of Client says goodbye; it may block briefly on the
    // socket, so do it without the GIL.
    py::gil_scoped_release release;
    client_.reset();
  }

  Client& client() { return *client_; }
  const std::vector<ClientParam>& params() const { return params_; }

  void CheckParam(int i) const {
    if (i < 0 || i >= static_cast<int>(params_.size())) {
      throw py::index_error("parameter index " + std::to_string(i) +
                            " out of range [0, " +
                            std::to_string(params_.size()) + ")");
    }
  }
  void CheckBucket(int b) const {
    if (b < 0 || b >= client_->num_buckets()) {
      throw py::index_error("bucket index " + std::to_string(b) +
                            " out of range [0, " +
                            std::to_string(client_->num_buckets()) + ")");
    }
  }

  // `stream`: a CUDA stream handle (torch's Stream.cuda_stream; 0 = the
  // legacy default stream) for CUDA parameters; ignored for host ones.
  void MarkReady(int i, uintptr_t stream) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->MarkReadyOn(i, reinterpret_cast<void*>(stream));
    }
    Check(s);
  }

  void MarkUnused(int i, bool keep) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->MarkUnused(
          i, keep ? UnusedGradient::kKeep : UnusedGradient::kZero);
    }
    Check(s);
  }

  void SkipUsedMap() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(call_mu_);
      s = client_->SkipUsedMap();
    }
    Check(s);
  }

  void WaitAll(uintptr_t stream) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(call_mu_);
      s = client_->WaitAllOn(reinterpret_cast<void*>(stream));
    }
    Check(s);
  }

  // Client::WaitBucketOn (GIL released); the bucket index checked by the
  // caller (CheckBucket).
  void WaitBucket(int bucket, uintptr_t stream) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(call_mu_);
      s = client_->WaitBucketOn(bucket, reinterpret_cast<void*>(stream));
    }
    Check(s);
  }

  // collective_bindings.cc. Arrays are taken as they are (no conversion: an
  // in-place result must land in the caller's array): C-contiguous, native
  // byte order, float32/float64/float16, int32/int64/uint8/int8, or
  // int16/uint16 holding bfloat16 bits with bfloat16=True. Errors are
  // GraddErrors (InvalidArgumentError is also a ValueError).
  void Broadcast(const py::buffer& data, int root);
  void Allreduce(py::array array, const std::string& op, bool bfloat16);
  void Allgather(const py::array& input, py::array output);
  void ReduceScatter(const py::array& input, py::array output,
                     const std::string& op, bool bfloat16);
  void Barrier();

  void SetCommHook(const CommHookOptions& hook) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(call_mu_);
      s = client_->SetCommHook(hook);
    }
    Check(s);
  }

  // join_rebuild_bindings.cc.
  void JoinEnter(bool divide_by_initial_world_size,
                 bool throw_on_early_termination);
  void JoinActive(const std::optional<py::buffer>& data);
  int Join();
  bool RebuildBuckets();

  // restart_bindings.cc: Client::BeginStateSync (GIL released); the root.
  int BeginStateSync();

  void Detach() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(call_mu_);
      s = client_->Detach();
    }
    Check(s);
  }

 private:
  std::unique_ptr<Client> client_;
  std::vector<ClientParam> params_;
  std::mutex call_mu_;
};

// collective_bindings.cc: broadcast, allreduce, allgather, reduce_scatter,
// barrier on the Client class.
void DefineCollectives(py::class_<PyClient>& client);
// join_rebuild_bindings.cc: join_enter, join_active, join, in_join,
// rebuild_buckets, has_rebuilt_buckets, ready_order on the Client class.
void DefineJoinAndRebuild(py::class_<PyClient>& client);
// restart_bindings.cc: rejoined, rank_restart_grace_ms, iterations_aborted,
// restarts, state_sync_pending, begin_state_sync on the Client class, and
// the module's _raise_status (tests of the error mapping).
void DefineRankRestart(py::module_& m, py::class_<PyClient>& client);

}  // namespace gradd::python

#endif  // GRADD_CLIENT_PYTHON_PY_CLIENT_H_
