// gradd._C: the Python binding of the client library
// (client/include/gradd/client.h).
//
// A PyClient (py_client.h) owns one gradd::Client. Gradient views are numpy
// arrays over the shared bucket memory whose base object is the PyClient, so
// the mapping stays alive as long as any view (or a torch tensor made from
// one with torch.from_numpy) exists, even after detach().
//
// Threads: mark_ready may run on several threads at once (autograd threads);
// it releases the GIL. wait_all, broadcast and attach block and release the
// GIL; they are serialised by call_mu_ because the client library allows one
// caller at a time for everything but MarkReady.
//
// Errors: every non-OK absl::Status raises gradd.GraddError (a RuntimeError)
// or the subclass for its canonical code, with the daemon's message and the
// code's name in the `code` attribute (errors.cc). Nothing here aborts the
// interpreter.
//
// This file: the module's init, attach, and the Client's data path and
// properties; the collectives (collective_bindings.cc) and join / bucket
// rebuild (join_rebuild_bindings.cc) are registered on the class from here,
// in the order the methods have always been defined.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradd/client.h"
#include "py_client.h"

namespace gradd::python {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  if (seconds < 0) throw py::value_error("timeouts must be >= 0 seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Accepts 1..4, "float32"/"float"/"fp32", "float64"/"double",
// "float16"/"half", "bfloat16"/"bf16", or torch/numpy dtype spellings such as
// "torch.float32".
int32_t ParseDType(const py::handle& h) {
  if (py::isinstance<py::int_>(h)) {
    int v = h.cast<int>();
    if (v < 1 || v > 4) {
      throw py::value_error("unknown gradd dtype value " + std::to_string(v));
    }
    return v;
  }
  std::string s = py::str(h);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "float32" || s == "float" || s == "fp32") return 1;
  if (s == "float64" || s == "double" || s == "fp64") return 2;
  if (s == "float16" || s == "half" || s == "fp16") return 3;
  if (s == "bfloat16" || s == "bf16") return 4;
  throw py::value_error(
      "unsupported dtype '" + s +
      "' (gradd reduces float32, float64, float16 and bfloat16)");
}

const char* DTypeName(int32_t dtype) {
  switch (dtype) {
    case 1:
      return "float32";
    case 2:
      return "float64";
    case 3:
      return "float16";
    case 4:
      return "bfloat16";
    default:
      return "unknown";
  }
}

size_t DTypeBytes(int32_t dtype) {
  switch (dtype) {
    case 1:
      return 4;
    case 2:
      return 8;
    case 3:
    case 4:
      return 2;
    default:
      return 1;
  }
}

// The numpy dtype of a view. numpy has no bfloat16: its views are int16
// arrays holding the raw bits (torch: .view(torch.bfloat16)).
py::dtype NumpyDType(int32_t dtype) {
  switch (dtype) {
    case 1:
      return py::dtype("float32");
    case 2:
      return py::dtype("float64");
    case 3:
      return py::dtype("float16");
    case 4:
      return py::dtype("int16");
    default:
      return py::dtype("uint8");
  }
}

std::vector<ClientParam> ParseParams(const py::iterable& params) {
  std::vector<ClientParam> out;
  for (py::handle item : params) {
    py::tuple t = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
    if (t.size() != 3 && t.size() != 4) {
      throw py::value_error(
          "each parameter is a (name, shape, dtype[, device]) tuple");
    }
    ClientParam p;
    p.name = t[0].cast<std::string>();
    for (py::handle d : t[1].cast<py::iterable>()) {
      int64_t v = d.cast<int64_t>();
      if (v < 0) {
        throw py::value_error("parameter '" + p.name +
                              "' has a negative dimension");
      }
      p.shape.push_back(v);
    }
    p.dtype = ParseDType(t[2]);
    if (t.size() == 4) {
      const std::string device = py::str(t[3]).cast<std::string>();
      if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
        p.device = 1;
      } else if (device != "cpu") {
        throw py::value_error("parameter '" + p.name + "': device '" + device +
                              "' is neither 'cpu' nor 'cuda'");
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::unique_ptr<PyClient> Attach(
    const py::iterable& params, const std::string& socket,
    const std::string& job_id, int local_rank, int local_world_size,
    double bucket_cap_mb, double first_bucket_cap_mb, size_t broadcast_bytes,
    size_t collective_bytes, double connect_timeout, double attach_timeout,
    double wait_timeout, const std::string& node_id,
    std::optional<int> node_rank, int num_nodes, const std::string& coordinator,
    bool find_unused_parameters, bool rebuild_buckets,
    const std::string& comm_hook, int world_size, std::optional<int> rank,
    int cuda_device, std::optional<int64_t> rank_restart_grace_ms,
    std::optional<int64_t> min_nodes, bool divide_by_initial_world_size,
    bool bucket_cap_auto, bool follow_plan_switches) {
  ClientOptions options;
  options.world_size = world_size;
  options.rank = rank;
  options.cuda_device = cuda_device;
  options.comm_hook.name = comm_hook;
  options.socket_path = socket;
  options.job_id = job_id;
  options.local_rank = local_rank;
  options.local_world_size = local_world_size;
  options.bucket_cap_mb = bucket_cap_mb;
  options.first_bucket_cap_mb = first_bucket_cap_mb;
  options.broadcast_bytes = broadcast_bytes;
  options.collective_bytes = collective_bytes;
  options.connect_timeout = Millis(connect_timeout);
  options.attach_timeout = Millis(attach_timeout);
  options.wait_timeout = Millis(wait_timeout);
  options.node_id = node_id;
  options.node_rank = node_rank;
  options.num_nodes = num_nodes;
  options.coordinator = coordinator;
  options.find_unused_parameters = find_unused_parameters;
  options.rebuild_buckets = rebuild_buckets;
  options.bucket_cap_auto = bucket_cap_auto;
  options.follow_plan_switches = follow_plan_switches;
  if (rank_restart_grace_ms.has_value()) {
    if (*rank_restart_grace_ms < 0 || *rank_restart_grace_ms > UINT32_MAX) {
      throw py::value_error(
          "rank_restart_grace_ms must be in [0, 2^32) ms, got " +
          std::to_string(*rank_restart_grace_ms));
    }
    options.rank_restart_grace_ms =
        static_cast<uint32_t>(*rank_restart_grace_ms);
  }
  if (min_nodes.has_value()) {
    if (*min_nodes < 0 || *min_nodes > UINT32_MAX) {
      throw py::value_error("min_nodes must be in [0, 2^32), got " +
                            std::to_string(*min_nodes));
    }
    options.min_nodes = static_cast<uint32_t>(*min_nodes);
  }
  options.divide_by_initial_world_size = divide_by_initial_world_size;
  std::vector<ClientParam> specs = ParseParams(params);

  absl::StatusOr<std::unique_ptr<Client>> client;
  {
    py::gil_scoped_release release;
    client = Client::Attach(options, specs);
  }
  if (!client.ok()) RaiseStatus(client.status());
  return std::make_unique<PyClient>(std::move(client).value(),
                                    std::move(specs));
}

}  // namespace
}  // namespace gradd::python

PYBIND11_MODULE(_C, m) {
  using gradd::python::PyClient;
  m.doc() =
      "Binding of the gradd client library (see "
      "client/include/gradd/client.h). "
      "Use gradd.attach() / gradd.torch.DistributedDataParallel.";

  gradd::python::RegisterErrors(m);

  py::class_<PyClient> client(
      m, "Client",
      "One local rank of one job attached to the node's gradd "
      "daemon. Create with gradd.attach().");
  client
      .def_property_readonly(
          "num_params", [](PyClient& c) { return c.client().num_params(); })
      .def_property_readonly(
          "num_buckets", [](PyClient& c) { return c.client().num_buckets(); })
      .def_property_readonly(
          "iteration", [](PyClient& c) { return c.client().iteration(); },
          "Number of the current (not yet waited) iteration, from 1.")
      .def_property_readonly(
          "global_rank", [](PyClient& c) { return c.client().global_rank(); })
      .def_property_readonly(
          "rank", [](PyClient& c) { return c.client().global_rank(); })
      .def_property_readonly(
          "world_size", [](PyClient& c) { return c.client().world_size(); })
      .def_property_readonly(
          "local_rank", [](PyClient& c) { return c.client().local_rank(); })
      .def_property_readonly(
          "local_world_size",
          [](PyClient& c) { return c.client().local_world_size(); })
      .def_property_readonly(
          "params",
          [](PyClient& c) {
            py::list out;
            for (const auto& p : c.params()) {
              out.append(py::make_tuple(p.name, py::tuple(py::cast(p.shape)),
                                        gradd::python::DTypeName(p.dtype)));
            }
            return out;
          },
          "The registered parameters as (name, shape, dtype name) tuples.")
      .def(
          "gradient",
          [](py::object self, int i) {
            PyClient& c = self.cast<PyClient&>();
            c.CheckParam(i);
            const gradd::ClientParam& p = c.params()[i];
            void* ptr = c.client().gradient(i);
            if (ptr == nullptr) {
              throw py::value_error("parameter " + std::to_string(i) +
                                    " has no gradient memory");
            }
            if (c.client().gradient_device(i) != 0) {
              throw py::value_error(
                  "parameter " + std::to_string(i) +
                  "'s gradient is CUDA memory; use gradient_address (and "
                  "gradd.torch's views) instead of a numpy array");
            }
            std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
            std::vector<py::ssize_t> strides(shape.size());
            py::ssize_t stride = gradd::python::DTypeBytes(p.dtype);
            for (size_t k = shape.size(); k-- > 0;) {
              strides[k] = stride;
              stride *= shape[k];
            }
            // base = self: the array keeps the client (and its mapping) alive.
            return py::array(gradd::python::NumpyDType(p.dtype), shape, strides,
                             ptr, self);
          },
          py::arg("param"),
          "Parameter `param`'s gradient in shared bucket memory, as a writable "
          "numpy array (no copy; bfloat16 gradients are int16 arrays of the "
          "raw "
          "bits). The array keeps the client alive.")
      .def(
          "gradient_address",
          [](PyClient& c, int i) {
            c.CheckParam(i);
            return reinterpret_cast<uintptr_t>(c.client().gradient(i));
          },
          py::arg("param"))
      .def(
          "gradient_device",
          [](PyClient& c, int i) {
            c.CheckParam(i);
            return c.client().gradient_device(i) != 0 ? "cuda" : "cpu";
          },
          py::arg("param"),
          "'cuda' when parameter `param`'s gradient is device memory "
          "(gradient_address is then a device address), else 'cpu'.")
      .def(
          "gradient_nbytes",
          [](PyClient& c, int i) {
            c.CheckParam(i);
            return c.client().gradient_bytes(i);
          },
          py::arg("param"))
      .def("mark_ready", &PyClient::MarkReady, py::arg("param"),
           py::arg("stream") = 0,
           "Marks parameter `param`'s gradient final for this iteration "
           "(releases the GIL). The last parameter of a bucket hands the "
           "bucket to the daemon. CUDA parameters: `stream` (a CUDA stream "
           "handle, 0 = the legacy default stream) is the stream that wrote "
           "the gradient; it records the bucket's ready event, the CPU "
           "never waits for the GPU.")
      .def("mark_unused", &PyClient::MarkUnused, py::arg("param"),
           py::arg("keep") = false,
           "find_unused_parameters only: marks `param` ready without "
           "counting it as used by this rank; keep=False zeroes its gradient "
           "first, keep=True contributes what the memory holds.")
      .def(
          "globally_used",
          [](PyClient& c, int i) {
            c.CheckParam(i);
            return c.client().GloballyUsed(i);
          },
          py::arg("param"),
          "After wait_all: whether some rank marked `param` with mark_ready "
          "in the iteration just waited for (always True without "
          "find_unused_parameters).")
      .def(
          "globally_used_all",
          [](PyClient& c) {
            std::vector<bool> out(c.params().size());
            for (size_t i = 0; i < out.size(); ++i) {
              out[i] = c.client().GloballyUsed(static_cast<int>(i));
            }
            return out;
          },
          "globally_used(i) for every parameter, as a list.")
      .def("skip_used_map", &PyClient::SkipUsedMap,
           "find_unused_parameters only: this iteration needs no used map "
           "(every parameter counts as used); hands its slot over now.")
      .def("wait_all", &PyClient::WaitAll, py::arg("stream") = 0,
           "Blocks (GIL released) until every bucket of the iteration holds "
           "the average over all ranks, then starts the next iteration. "
           "CUDA buckets: `stream` then waits (on the GPU) for the daemon's "
           "reduction before any work queued on it later.")
      .def(
          "wait_bucket",
          [](PyClient& c, int b, uintptr_t stream) {
            c.CheckBucket(b);
            c.WaitBucket(b, stream);
          },
          py::arg("bucket"), py::arg("stream") = 0,
          "Blocks (GIL released) until bucket `bucket` of the iteration "
          "holds the average over all ranks, without ending the iteration "
          "(wait_all does, at once when every bucket was waited for). Every "
          "parameter of the bucket must have been marked. CUDA buckets: "
          "`stream` then waits (on the GPU) for the daemon's reduction.")
      .def(
          "bucket_done",
          [](PyClient& c, int b) {
            c.CheckBucket(b);
            return c.client().BucketDone(b);
          },
          py::arg("bucket"))
      .def(
          "bucket",
          [](PyClient& c, int b) {
            c.CheckBucket(b);
            const gradd::BucketInfo& info = c.client().bucket(b);
            py::dict d;
            d["dtype"] = gradd::python::DTypeName(info.dtype);
            d["size_bytes"] = info.size_bytes;
            d["params"] = info.params;
            d["device"] = info.device != 0 ? "cuda" : "cpu";
            return d;
          },
          py::arg("bucket"),
          "dict(dtype=name, size_bytes=int, params=[param indices in bucket "
          "order]).");
  gradd::python::DefineCollectives(client);
  gradd::python::DefineJoinAndRebuild(client);
  gradd::python::DefineRankRestart(m, client);
  client
      .def(
          "set_comm_hook",
          [](PyClient& c, const std::string& name, int rank,
             std::optional<int64_t> start, double min_rate,
             std::optional<bool> error_feedback, std::optional<bool> warm_start,
             double epsilon, uint64_t seed, bool batch_same_shape) {
            gradd::CommHookOptions h;
            h.name = name;
            h.matrix_approximation_rank = rank;
            h.start_powersgd_iter = start;
            h.min_compression_rate = min_rate;
            h.use_error_feedback = error_feedback;
            h.warm_start = warm_start;
            h.orthogonalization_epsilon = epsilon;
            h.random_seed = seed;
            h.batch_tensors_with_same_shape = batch_same_shape;
            c.SetCommHook(h);
          },
          py::arg("name"), py::kw_only(),
          py::arg("matrix_approximation_rank") = 0,
          py::arg("start_powersgd_iter") = py::none(),
          py::arg("min_compression_rate") = 0.0,
          py::arg("use_error_feedback") = py::none(),
          py::arg("warm_start") = py::none(),
          py::arg("orthogonalization_epsilon") = 0.0,
          py::arg("random_seed") = 0,
          py::arg("batch_tensors_with_same_shape") = false,
          "Chooses the job's communication hook (run by the daemon) before "
          "the first backward; every local rank must choose the same.")
      .def("detach", &PyClient::Detach,
           "Clean goodbye. Views stay valid memory until they are dropped.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::args) {
        c.Detach();
        return false;
      });

  m.def("attach", &gradd::python::Attach, py::arg("params"), py::kw_only(),
        py::arg("socket") = "", py::arg("job_id") = "default",
        py::arg("local_rank") = 0, py::arg("local_world_size") = 1,
        py::arg("bucket_cap_mb") = 0.0, py::arg("first_bucket_cap_mb") = 0.0,
        py::arg("broadcast_bytes") = 0, py::arg("collective_bytes") = 0,
        py::arg("connect_timeout") = 10.0, py::arg("attach_timeout") = 120.0,
        py::arg("wait_timeout") = 600.0, py::arg("node_id") = "",
        py::arg("node_rank") = py::none(), py::arg("num_nodes") = 0,
        py::arg("coordinator") = "", py::arg("find_unused_parameters") = false,
        py::arg("rebuild_buckets") = true, py::arg("comm_hook") = "",
        py::arg("world_size") = 0, py::arg("rank") = py::none(),
        py::arg("cuda_device") = -1,
        py::arg("rank_restart_grace_ms") = py::none(),
        py::arg("min_nodes") = py::none(),
        py::arg("divide_by_initial_world_size") = false,
        py::arg("bucket_cap_auto") = false,
        py::arg("follow_plan_switches") = false,
        "Attaches to the node's gradd daemon as one local rank of a job and "
        "registers `params`, a sequence of (name, shape, dtype[, device]) "
        "tuples (device 'cpu' or 'cuda'; CUDA parameters live on GPU "
        "`cuda_device`, this process's ordinal). "
        "Blocks (GIL released) until every local rank has attached. "
        "socket='' uses $GRADD_SOCKET or the daemon's default path; timeouts "
        "are in seconds; bucket caps of 0 use the daemon's defaults. "
        "find_unused_parameters=True adds the per-iteration used map "
        "(mark_unused, globally_used). collective_bytes: the shared area "
        "for allreduce/allgather/reduce_scatter/barrier (0: 4 MiB when "
        "params is empty, a collective-only job). rank_restart_grace_ms: "
        "how long the daemon keeps the job waiting for a rank whose process "
        "died, for it to be started again and re-attach (None: "
        "$GRADD_RANK_RESTART_GRACE_MS, else the daemon's setting; 0: the "
        "job fails at once); a restarted rank then has `rejoined` True. "
        "min_nodes: the fewest nodes a multi-node job goes on with when a "
        "node dies (None: $GRADD_MIN_NODES, else the daemon's; 0: all); "
        "divide_by_initial_world_size: average over the initial world "
        "after a node is lost or added.");
}
