// The Python binding's collectives (gradd._C.Client.broadcast, allreduce,
// allgather, reduce_scatter, barrier; client/include/gradd/collectives.h):
// numpy arrays and buffers checked and handed to the client library with the
// GIL released. Registered on the Client class by the module's init
// (gradd_module.cc), between the data path's methods and join's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "gradd/client.h"
#include "py_client.h"

namespace gradd::python {
namespace {

void CheckContiguous(const py::array& a, const char* what) {
  if (!(a.flags() & py::array::c_style)) {
    RaiseInvalid(std::string(what) + " must be a C-contiguous array");
  }
  const char order = a.dtype().byteorder();
  const bool little = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
  if ((order == '>' && little) || (order == '<' && !little)) {
    RaiseInvalid(std::string(what) + " must be in native byte order");
  }
}

void CheckWritable(const py::array& a, const char* what) {
  CheckContiguous(a, what);
  if (!a.writeable()) {
    RaiseInvalid(std::string(what) + " must be writable");
  }
}

// gradd::dtype::k* of a numpy array.
int32_t CollectiveDType(const py::array& a, bool bfloat16, const char* what) {
  CheckContiguous(a, what);
  const char kind = a.dtype().kind();
  const ssize_t size = a.itemsize();
  if (bfloat16) {
    if ((kind == 'i' || kind == 'u') && size == 2) return dtype::kBFloat16;
    RaiseInvalid(std::string(what) +
                 ": bfloat16=True needs an int16/uint16 array holding the "
                 "bfloat16 bits");
  }
  if (kind == 'f' && size == 4) return dtype::kFloat32;
  if (kind == 'f' && size == 8) return dtype::kFloat64;
  if (kind == 'f' && size == 2) return dtype::kFloat16;
  if (kind == 'i' && size == 4) return dtype::kInt32;
  if (kind == 'i' && size == 8) return dtype::kInt64;
  if (kind == 'u' && size == 1) return dtype::kUInt8;
  if (kind == 'i' && size == 1) return dtype::kInt8;
  RaiseInvalid(std::string(what) + ": unsupported dtype " +
               std::string(py::str(a.dtype())) +
               " (float32, float64, float16, int32, int64, uint8, int8; "
               "bfloat16 as int16 bits with bfloat16=True)");
}

ReduceOp ParseOp(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "avg") return ReduceOp::kAvg;
  if (op == "min") return ReduceOp::kMin;
  if (op == "max") return ReduceOp::kMax;
  RaiseInvalid("unknown reduce op '" + op + "' (sum, avg, min, max)");
}

}  // namespace

void PyClient::Broadcast(const py::buffer& data, int root) {
  py::buffer_info info = data.request(/*writable=*/true);
  if (!PyBuffer_IsContiguous(reinterpret_cast<Py_buffer*>(info.view()), 'A')) {
    throw py::value_error("broadcast needs a contiguous buffer");
  }
  const size_t bytes = static_cast<size_t>(info.size) * info.itemsize;
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->Broadcast(info.ptr, bytes, root);
  }
  Check(s);
}

void PyClient::Allreduce(py::array array, const std::string& op,
                         bool bfloat16) {
  const int32_t dtype = CollectiveDType(array, bfloat16, "allreduce");
  const ReduceOp reduce = ParseOp(op);
  CheckWritable(array, "allreduce");
  void* data = array.size() > 0 ? array.mutable_data() : nullptr;
  const size_t count = static_cast<size_t>(array.size());
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->Allreduce(data, count, dtype, reduce);
  }
  Check(s);
}

void PyClient::Allgather(const py::array& input, py::array output) {
  CheckContiguous(input, "allgather input");
  CheckWritable(output, "allgather output");
  const size_t bytes = static_cast<size_t>(input.nbytes());
  const size_t world = static_cast<size_t>(client_->world_size());
  if (static_cast<size_t>(output.nbytes()) != bytes * world) {
    RaiseStatus(absl::InvalidArgumentError(
        "allgather: output has " + std::to_string(output.nbytes()) +
        " bytes; it needs world_size (" + std::to_string(world) +
        ") x input's " + std::to_string(bytes)));
  }
  const void* in = bytes > 0 ? input.data() : nullptr;
  void* out = bytes > 0 ? output.mutable_data() : nullptr;
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->Allgather(in, bytes, out);
  }
  Check(s);
}

void PyClient::ReduceScatter(const py::array& input, py::array output,
                             const std::string& op, bool bfloat16) {
  const int32_t dtype = CollectiveDType(input, bfloat16, "reduce_scatter");
  if (CollectiveDType(output, bfloat16, "reduce_scatter") != dtype ||
      output.itemsize() != input.itemsize()) {
    RaiseStatus(absl::InvalidArgumentError(
        "reduce_scatter: input and output have different dtypes"));
  }
  const ReduceOp reduce = ParseOp(op);
  CheckWritable(output, "reduce_scatter output");
  const size_t count = static_cast<size_t>(output.size());
  const size_t world = static_cast<size_t>(client_->world_size());
  if (static_cast<size_t>(input.size()) != count * world) {
    RaiseStatus(absl::InvalidArgumentError(
        "reduce_scatter: input has " + std::to_string(input.size()) +
        " elements; it needs world_size (" + std::to_string(world) +
        ") x output's " + std::to_string(count)));
  }
  const void* in = count > 0 ? input.data() : nullptr;
  void* out = count > 0 ? output.mutable_data() : nullptr;
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->ReduceScatter(in, out, count, dtype, reduce);
  }
  Check(s);
}

void PyClient::Barrier() {
  absl::Status s;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(call_mu_);
    s = client_->Barrier();
  }
  Check(s);
}

void DefineCollectives(py::class_<PyClient>& client) {
  client
      .def("broadcast", &PyClient::Broadcast, py::arg("data"),
           py::arg("root") = 0,
           "Daemon-mediated broadcast, in place, of a writable contiguous "
           "buffer (bytes <= the attach's broadcast_bytes) from global rank "
           "`root`. Every rank must make the same sequence of calls.")
      .def("allreduce", &PyClient::Allreduce, py::arg("array").noconvert(),
           py::arg("op") = "sum", py::kw_only(), py::arg("bfloat16") = false,
           "In place: array = op over every rank's array (op 'sum', 'avg', "
           "'min', 'max'; avg of integers is refused). Blocks, GIL "
           "released; every rank must call the same collectives.")
      .def("allgather", &PyClient::Allgather, py::arg("input").noconvert(),
           py::arg("output").noconvert(),
           "output (world_size x input's bytes) = every rank's input in "
           "rank order.")
      .def("reduce_scatter", &PyClient::ReduceScatter,
           py::arg("input").noconvert(), py::arg("output").noconvert(),
           py::arg("op") = "sum", py::kw_only(), py::arg("bfloat16") = false,
           "input: world_size x output's elements; output = this rank's "
           "block of the element-wise reduction.")
      .def("barrier", &PyClient::Barrier,
           "Returns once every rank of the job entered the barrier.");
}

}  // namespace gradd::python
