// The Python binding's errors: gradd.GraddError (a RuntimeError) and one
// subclass per canonical absl::StatusCode, created at module init
// (RegisterErrors), and RaiseStatus, which turns a non-OK status into the
// subclass for its code with the message and the code's name in `code`.
// One class is narrower than its code: gradd.IterationAbortedError (an
// AbortedError) for the ABORTED status of an iteration or collective round
// aborted by a rank restart (gradd::IsIterationAborted: skip the optimizer
// step and retry the batch; the job goes on). Every other ABORTED stays
// AbortedError (the job failed).
#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "absl/status/status.h"
#include "py_client.h"

namespace gradd::python {
namespace {

// code -> exception class; filled at module init, lives as long as the module.
std::map<absl::StatusCode, py::object>* g_error_classes = nullptr;
py::object* g_base_error = nullptr;
py::object* g_iteration_aborted = nullptr;

py::object MakeError(py::module_& m, const char* name, py::handle base,
                     py::handle mixin, const char* doc) {
  py::object bases = mixin ? py::make_tuple(base, mixin) : py::make_tuple(base);
  std::string qualname = std::string("gradd.") + name;
  PyObject* cls =
      PyErr_NewExceptionWithDoc(qualname.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  py::object obj = py::reinterpret_steal<py::object>(cls);
  m.attr(name) = obj;
  return obj;
}

}  // namespace

[[noreturn]] void RaiseStatus(const absl::Status& status) {
  py::object cls = *g_base_error;
  if (IsIterationAborted(status)) {
    cls = *g_iteration_aborted;
  } else if (auto it = g_error_classes->find(status.code());
             it != g_error_classes->end()) {
    cls = it->second;
  }
  py::object exc = cls(std::string(status.message()));
  exc.attr("code") = absl::StatusCodeToString(status.code());
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

[[noreturn]] void RaiseInvalid(const std::string& message) {
  RaiseStatus(absl::InvalidArgumentError(message));
}

void RegisterErrors(py::module_& m) {
  // Exceptions: GraddError(RuntimeError) and one subclass per canonical code.
  // Leaked on purpose: these must outlive the interpreter's teardown.
  py::object& base = *new py::object(MakeError(
      m, "GraddError", PyExc_RuntimeError, nullptr,
      "An error reported by the gradd client library or daemon. `code` holds "
      "the absl::Status code name, e.g. 'FAILED_PRECONDITION'."));
  base.attr("code") = "UNKNOWN";
  g_base_error = &base;
  auto& classes = *new std::map<absl::StatusCode, py::object>();
  struct Def {
    absl::StatusCode code;
    const char* name;
    PyObject* mixin;
  };
  const Def defs[] = {
      {absl::StatusCode::kCancelled, "CancelledError", nullptr},
      {absl::StatusCode::kUnknown, "UnknownError", nullptr},
      {absl::StatusCode::kInvalidArgument, "InvalidArgumentError",
       PyExc_ValueError},
      {absl::StatusCode::kDeadlineExceeded, "DeadlineExceededError", nullptr},
      {absl::StatusCode::kNotFound, "NotFoundError", nullptr},
      {absl::StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {absl::StatusCode::kPermissionDenied, "PermissionDeniedError", nullptr},
      {absl::StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {absl::StatusCode::kFailedPrecondition, "FailedPreconditionError",
       nullptr},
      {absl::StatusCode::kAborted, "AbortedError", nullptr},
      {absl::StatusCode::kOutOfRange, "OutOfRangeError", PyExc_IndexError},
      {absl::StatusCode::kUnimplemented, "UnimplementedError",
       PyExc_NotImplementedError},
      {absl::StatusCode::kInternal, "InternalError", nullptr},
      {absl::StatusCode::kUnavailable, "UnavailableError", nullptr},
      {absl::StatusCode::kDataLoss, "DataLossError", nullptr},
      {absl::StatusCode::kUnauthenticated, "UnauthenticatedError", nullptr},
  };
  for (const Def& d : defs) {
    py::object cls = MakeError(m, d.name, base, d.mixin, nullptr);
    cls.attr("code") = absl::StatusCodeToString(d.code);
    classes[d.code] = cls;
  }
  g_error_classes = &classes;
  // A rank restart's aborted iteration: the job goes on (see the top).
  py::object& aborted = *new py::object(MakeError(
      m, "IterationAbortedError", classes[absl::StatusCode::kAborted], nullptr,
      "The iteration (or collective round) was aborted because a rank of the "
      "job restarted and re-attached (rank_restart_grace_ms > 0): no rank "
      "applies it. Skip the optimizer step and retry the same batch; the job "
      "goes on. A subclass of AbortedError; code 'ABORTED'."));
  aborted.attr("code") = absl::StatusCodeToString(absl::StatusCode::kAborted);
  g_iteration_aborted = &aborted;
}

}  // namespace gradd::python
