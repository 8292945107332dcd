// A trainer process for the integration tests: attaches to a real gradd,
// runs iterations with a seeded random parameter-ready order over a model
// of mixed dtypes and checks every averaged value exactly. Modes inject the
// bad inputs the tests need.
//
// Output protocol (stdout, one line each, flushed), read by the tests:
//   ATTACHED rank=R world=W buckets=B params=P
//   EXPECTED_ERROR code=C <message>     a bad call failed as it should
//   STALLED iteration=T                 (mode stall) waiting to be killed
//   REBUILT order=<rank's recorded ready order> plan=<buckets' params>
//                                       (--rebuild-after) buckets re-planned
//   PASS iterations=N verified=V
//   ERROR code=C <message>              exit 3
//   MISMATCH <what>                     exit 4
// Exit codes: 0 pass, 2 usage, 3 gradd error, 4 wrong value, 5 a bad call
// unexpectedly succeeded.
//
// Gradient of element j of parameter p on rank r in iteration t (L ranks):
//   g = c + (2r - (L - 1)) / 2,   c = ((3j + 7t + 13p) mod 61 - 30) / 2
// Every g and every partial sum is a multiple of 1/2 below 64 in magnitude,
// exact in bfloat16, float16, float32 and float64, and the rank terms sum to
// zero, so the average is exactly c in every dtype and summation order.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gradd/client.h"

#if GRADD_HAVE_CUDA
#include "common/cuda/driver.h"
#include "common/cuda/owners.h"
#endif

namespace {

constexpr int kF32 = 1, kF64 = 2, kF16 = 3, kBF16 = 4;
// --cuda: gradients are device memory.
bool g_cuda_gradients = false;

struct Flags {
  std::string socket;
  std::string job = "test";
  // -1 / 0: from the launcher's LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun).
  int local_rank = -1;
  int local_world_size = 0;
  int iterations = 10;
  uint64_t seed = 1;
  std::string model = "mixed";
  std::string mode = "normal";
  int threads = 1;
  int stall_at = 3;
  int sleep_ms = 0;
  double bucket_cap_mb = 0.01;
  double first_bucket_cap_mb = 0.002;
  int64_t connect_timeout_ms = 10000;
  int64_t attach_timeout_ms = 30000;
  int64_t wait_timeout_ms = 30000;
  int64_t broadcast_bytes = 0;
  // Multi-node (-1 / 0 / empty: unset).
  int node_rank = -1;
  int num_nodes = 0;
  std::string node_id;
  std::string coordinator;
  // Call RebuildBuckets after this iteration (0: never); with --mode
  // skip_rebuild, local rank 1 does not and goes on.
  int rebuild_after = 0;
  // Every parameter on CUDA device 0 (a real GPU, or the daemon's fake one
  // when GRADD_FAKE_GPU_UUID is set).
  bool cuda = false;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return false;
    }
    bool ok = true;
    if (arg == "--socket")
      f->socket = value;
    else if (arg == "--job")
      f->job = value;
    else if (arg == "--model")
      f->model = value;
    else if (arg == "--mode")
      f->mode = value;
    else if (arg == "--local-rank")
      ok = absl::SimpleAtoi(value, &f->local_rank);
    else if (arg == "--local-world-size")
      ok = absl::SimpleAtoi(value, &f->local_world_size);
    else if (arg == "--iterations")
      ok = absl::SimpleAtoi(value, &f->iterations);
    else if (arg == "--seed")
      ok = absl::SimpleAtoi(value, &f->seed);
    else if (arg == "--threads")
      ok = absl::SimpleAtoi(value, &f->threads);
    else if (arg == "--stall-at")
      ok = absl::SimpleAtoi(value, &f->stall_at);
    else if (arg == "--sleep-ms")
      ok = absl::SimpleAtoi(value, &f->sleep_ms);
    else if (arg == "--bucket-cap-mb")
      ok = absl::SimpleAtod(value, &f->bucket_cap_mb);
    else if (arg == "--first-bucket-cap-mb")
      ok = absl::SimpleAtod(value, &f->first_bucket_cap_mb);
    else if (arg == "--connect-timeout-ms")
      ok = absl::SimpleAtoi(value, &f->connect_timeout_ms);
    else if (arg == "--attach-timeout-ms")
      ok = absl::SimpleAtoi(value, &f->attach_timeout_ms);
    else if (arg == "--wait-timeout-ms")
      ok = absl::SimpleAtoi(value, &f->wait_timeout_ms);
    else if (arg == "--broadcast-bytes")
      ok = absl::SimpleAtoi(value, &f->broadcast_bytes);
    else if (arg == "--node-rank")
      ok = absl::SimpleAtoi(value, &f->node_rank);
    else if (arg == "--num-nodes")
      ok = absl::SimpleAtoi(value, &f->num_nodes);
    else if (arg == "--node-id")
      f->node_id = value;
    else if (arg == "--coordinator")
      f->coordinator = value;
    else if (arg == "--rebuild-after")
      ok = absl::SimpleAtoi(value, &f->rebuild_after);
    else if (arg == "--cuda")
      ok = absl::SimpleAtob(value, &f->cuda);
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "bad flag %s=%s\n", arg.c_str(), value.c_str());
      return false;
    }
  }
  return f->threads >= 1;
}

void Line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// Sizes chosen to straddle the small bucket caps: single elements, odd
// sizes (alignment), and tensors larger than the cap (buckets of their own).
std::vector<gradd::ClientParam> MakeModel(const std::string& which) {
  if (which == "large") {
    // Buckets above the daemons' fused threshold (512 KiB) with a 1 MB cap:
    // float32 and float64 tensors of odd sizes, plus a float16 one that
    // takes the accumulator path.
    return {{"large.0.weight", {301, 1000}, kF32},
            {"large.0.bias", {150007}, kF64},
            {"large.1.weight", {1000}, kF16},
            {"large.1.bias", {200003}, kF32}};
  }
  static constexpr int64_t kNumel[] = {
      1,  7,   64,  300, 1000, 2500, 5000, 3, 17,  129, 4096, 800,
      33, 900, 257, 2,   6000, 511,  40,   1, 700, 99,  1500, 12};
  std::vector<gradd::ClientParam> model;
  int i = 0;
  for (int64_t n : kNumel) {
    const int dtype = 1 + i % 4;
    std::vector<int64_t> shape = (n % 2 == 0 && n > 2)
                                     ? std::vector<int64_t>{2, n / 2}
                                     : std::vector<int64_t>{n};
    // "alt" differs from "mixed" in one parameter's shape only, the way a
    // rank built with a different config would.
    if (which == "alt" && i == 5) shape = {n + 1};
    model.push_back(
        {absl::StrCat("layer", i, i % 2 ? ".bias" : ".weight"), shape, dtype});
    ++i;
  }
  return model;
}

size_t ElementSize(int dtype) {
  return dtype == kF64 ? 8 : dtype == kF32 ? 4 : 2;
}

// Exact encodings for the values used here (multiples of 1/2, |x| < 2^10):
// callers only pass values representable in every dtype.
uint16_t ToBF16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}
float FromBF16(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint16_t ToF16(float f) {
  if (f == 0) return 0;
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = b >> 31;
  const int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  const uint32_t mant = (b & 0x7fffff) >> 13;
  return static_cast<uint16_t>((sign << 15) | (exp << 10) | mant);
}
double FromF16(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

void Store(void* base, int dtype, size_t j, double v) {
  switch (dtype) {
    case kF32:
      static_cast<float*>(base)[j] = static_cast<float>(v);
      break;
    case kF64:
      static_cast<double*>(base)[j] = v;
      break;
    case kF16:
      static_cast<uint16_t*>(base)[j] = ToF16(static_cast<float>(v));
      break;
    default:
      static_cast<uint16_t*>(base)[j] = ToBF16(static_cast<float>(v));
  }
}

double Load(const void* base, int dtype, size_t j) {
  switch (dtype) {
    case kF32:
      return static_cast<const float*>(base)[j];
    case kF64:
      return static_cast<const double*>(base)[j];
    case kF16:
      return FromF16(static_cast<const uint16_t*>(base)[j]);
    default:
      return FromBF16(static_cast<const uint16_t*>(base)[j]);
  }
}

double Expected(uint64_t t, int p, size_t j) {
  return static_cast<double>(
             static_cast<int64_t>((3 * j + 7 * t + 13 * p) % 61) - 30) *
         0.5;
}

// Real device memory is copied through the driver (synchronous copies on
// the legacy default stream, the stream MarkReadyOn/WaitAllOn are given);
// host memory and the fake GPU's memfd are plain memory.
#if GRADD_HAVE_CUDA
bool RealGpu() {
  const char* fake = std::getenv("GRADD_FAKE_GPU_UUID");
  return fake == nullptr || *fake == '\0';
}
#endif

void CopyIn(void* dst, const std::vector<char>& src) {
#if GRADD_HAVE_CUDA
  if (g_cuda_gradients && RealGpu()) {
    const auto* d = *gradd::cuda::CudaDriver::Get();
    d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                     reinterpret_cast<CUdeviceptr>(src.data()), src.size(),
                     nullptr);
    d->cuStreamSynchronize(nullptr);
    return;
  }
#endif
  std::memcpy(dst, src.data(), src.size());
}

void CopyOut(std::vector<char>& dst, const void* src) {
#if GRADD_HAVE_CUDA
  if (g_cuda_gradients && RealGpu()) {
    const auto* d = *gradd::cuda::CudaDriver::Get();
    d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst.data()),
                     reinterpret_cast<CUdeviceptr>(src), dst.size(), nullptr);
    d->cuStreamSynchronize(nullptr);
    return;
  }
#endif
  std::memcpy(dst.data(), src, dst.size());
}

class Trainer {
 public:
  Trainer(const Flags& flags, std::vector<gradd::ClientParam> model,
          std::unique_ptr<gradd::Client> client)
      : flags_(flags), model_(std::move(model)), client_(std::move(client)) {}

  int Run();

 private:
  void Write(uint64_t t, int p) {
    const int world = client_->world_size();
    const double rank_term = (2.0 * client_->global_rank() - (world - 1)) / 2;
    std::vector<char> staged(client_->gradient_bytes(p));
    const size_t n = staged.size() / ElementSize(model_[p].dtype);
    for (size_t j = 0; j < n; ++j) {
      Store(staged.data(), model_[p].dtype, j, Expected(t, p, j) + rank_term);
    }
    CopyIn(client_->gradient(p), staged);
  }
  // Writes and marks `ps`; the first error, if any.
  absl::Status WriteAndMark(uint64_t t, const std::vector<int>& ps) {
    for (int p : ps) {
      Write(t, p);
      // The legacy default stream: the copy above was issued on it.
      if (auto s = client_->MarkReadyOn(p, nullptr); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  int Fail(const absl::Status& s) {
    Line(absl::StrCat("ERROR code=", static_cast<int>(s.code()), " ",
                      s.message()));
    return 3;
  }
  // A call that must fail with `code`; exit status 5 if it did not.
  bool Expect(const absl::Status& s, absl::StatusCode code) {
    if (s.code() != code) {
      Line(absl::StrCat("UNEXPECTED ", s.ToString(), " (wanted code ",
                        static_cast<int>(code), ")"));
      return false;
    }
    Line(absl::StrCat("EXPECTED_ERROR code=", static_cast<int>(s.code()), " ",
                      s.message()));
    return true;
  }
  int Verify(uint64_t t);
  int Broadcast();
  int Rebuild(uint64_t t);

  const Flags flags_;
  const std::vector<gradd::ClientParam> model_;
  std::unique_ptr<gradd::Client> client_;
  int64_t verified_ = 0;
};

int Trainer::Verify(uint64_t t) {
  for (int p = 0; p < client_->num_params(); ++p) {
    std::vector<char> staged(client_->gradient_bytes(p));
    CopyOut(staged, client_->gradient(p));
    const void* g = staged.data();
    const size_t n = staged.size() / ElementSize(model_[p].dtype);
    for (size_t j = 0; j < n; ++j) {
      const double got = Load(g, model_[p].dtype, j);
      const double want = Expected(t, p, j);
      if (got != want) {
        Line(absl::StrCat("MISMATCH iteration=", t, " ", model_[p].name, "[", j,
                          "] dtype=", model_[p].dtype, " got=", got,
                          " want=", want));
        return 4;
      }
    }
    verified_ += static_cast<int64_t>(n);
  }
  return 0;
}

std::string PlanText(const gradd::Client& c) {
  std::string out;
  for (int b = 0; b < c.num_buckets(); ++b) {
    absl::StrAppend(&out, b ? "|" : "");
    for (size_t k = 0; k < c.bucket(b).params.size(); ++k) {
      absl::StrAppend(&out, k ? "," : "", c.bucket(b).params[k]);
    }
  }
  return out;
}

// Re-plans the buckets after iteration t, then checks that every gradient
// still holds iteration t's average at its new place.
int Trainer::Rebuild(uint64_t t) {
  if (flags_.mode == "skip_rebuild" && client_->local_rank() == 1) return 0;
  std::string order;
  for (int32_t p : client_->ready_order()) {
    absl::StrAppend(&order, order.empty() ? "" : ",", p);
  }
  const std::string before = PlanText(*client_);
  absl::StatusOr<bool> rebuilt = client_->RebuildBuckets();
  if (!rebuilt.ok()) return Fail(rebuilt.status());
  if (!*rebuilt || !client_->buckets_rebuilt()) {
    Line("MISMATCH RebuildBuckets did not rebuild");
    return 4;
  }
  Line(absl::StrCat("REBUILT order=", order, " before=", before,
                    " plan=", PlanText(*client_)));
  return Verify(t);
}

int Trainer::Broadcast() {
  // Rank 0 sends a pattern, then the last rank does: every rank must end up
  // with the root's bytes, whatever it held before.
  const size_t bytes = static_cast<size_t>(flags_.broadcast_bytes);
  const int world = client_->world_size();
  for (int root : {0, world - 1}) {
    std::vector<uint8_t> data(bytes);
    for (size_t i = 0; i < bytes; ++i) {
      data[i] = static_cast<uint8_t>(
          client_->global_rank() == root ? (i * 31 + root + 1) & 0xff : 0xee);
    }
    if (auto s = client_->Broadcast(data.data(), bytes, root); !s.ok()) {
      return Fail(s);
    }
    for (size_t i = 0; i < bytes; ++i) {
      if (data[i] != static_cast<uint8_t>((i * 31 + root + 1) & 0xff)) {
        Line(absl::StrCat("MISMATCH broadcast from ", root, " byte ", i));
        return 4;
      }
    }
  }
  Line(absl::StrCat("BROADCAST_OK bytes=", bytes));
  return 0;
}

int Trainer::Run() {
  const int n = client_->num_params();
  if (flags_.broadcast_bytes > 0) {
    if (int rc = Broadcast(); rc != 0) return rc;
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;

  for (int iter = 0; iter < flags_.iterations; ++iter) {
    const uint64_t t = client_->iteration();
    std::mt19937_64 rng(flags_.seed * 1'000'003 +
                        static_cast<uint64_t>(client_->global_rank()) * 7919 +
                        t);
    std::shuffle(order.begin(), order.end(), rng);

    if (flags_.mode == "stall" && iter + 1 == flags_.stall_at) {
      // Half the gradients handed over, then we hang as a wedged trainer
      // would; the test kills us.
      if (auto s = WriteAndMark(t, {order.begin(), order.begin() + n / 2});
          !s.ok()) {
        return Fail(s);
      }
      Line(absl::StrCat("STALLED iteration=", t));
      while (true) pause();
    }
    if (flags_.mode == "double_mark" && iter == 1) {
      const int p = order[0];
      if (auto s = WriteAndMark(t, {p}); !s.ok()) return Fail(s);
      if (!Expect(client_->MarkReady(p),
                  absl::StatusCode::kFailedPrecondition)) {
        return 5;
      }
      // The rejected mark must not have counted: the iteration completes
      // normally once the others are marked.
      if (auto s = WriteAndMark(t, {order.begin() + 1, order.end()}); !s.ok()) {
        return Fail(s);
      }
    } else if (flags_.mode == "unknown_index" && iter == 1) {
      if (!Expect(client_->MarkReady(n), absl::StatusCode::kOutOfRange) ||
          !Expect(client_->MarkReady(-1), absl::StatusCode::kOutOfRange)) {
        return 5;
      }
      if (auto s = WriteAndMark(t, order); !s.ok()) return Fail(s);
    } else if (flags_.mode == "unmarked" && iter == 1) {
      // WaitAll before the last parameter is marked must name it, then
      // succeed once it is.
      if (auto s = WriteAndMark(t, {order.begin(), order.end() - 1}); !s.ok()) {
        return Fail(s);
      }
      if (!Expect(client_->WaitAll(), absl::StatusCode::kFailedPrecondition)) {
        return 5;
      }
      if (auto s = WriteAndMark(t, {order.back()}); !s.ok()) return Fail(s);
    } else if (flags_.threads > 1) {
      // MarkReady from several threads at once, as autograd would.
      std::vector<std::vector<int>> shares(flags_.threads);
      for (int k = 0; k < n; ++k)
        shares[k % flags_.threads].push_back(order[k]);
      std::vector<absl::Status> results(flags_.threads);
      std::vector<std::thread> threads;
      for (int k = 0; k < flags_.threads; ++k) {
        threads.emplace_back([this, t, &shares, &results, k] {
          results[k] = WriteAndMark(t, shares[k]);
        });
      }
      for (auto& th : threads) th.join();
      for (const auto& s : results) {
        if (!s.ok()) return Fail(s);
      }
    } else {
      if (auto s = WriteAndMark(t, order); !s.ok()) return Fail(s);
    }

    if (auto s = client_->WaitAllOn(nullptr); !s.ok()) return Fail(s);
    if (int rc = Verify(t); rc != 0) return rc;
    if (flags_.rebuild_after > 0 &&
        t == static_cast<uint64_t>(flags_.rebuild_after)) {
      if (int rc = Rebuild(t); rc != 0) return rc;
    }
    if (flags_.sleep_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(flags_.sleep_ms));
    }
  }
  Line(absl::StrCat("PASS iterations=", flags_.iterations,
                    " verified=", verified_));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  std::vector<gradd::ClientParam> model = MakeModel(flags.model);

  gradd::ClientOptions options;
  options.socket_path = flags.socket;
  options.job_id = flags.job;
  options.local_rank = flags.local_rank;
  options.local_world_size = flags.local_world_size;
  options.bucket_cap_mb = flags.bucket_cap_mb;
  options.first_bucket_cap_mb = flags.first_bucket_cap_mb;
  options.broadcast_bytes = static_cast<size_t>(flags.broadcast_bytes);
  options.connect_timeout = std::chrono::milliseconds(flags.connect_timeout_ms);
  options.attach_timeout = std::chrono::milliseconds(flags.attach_timeout_ms);
  options.wait_timeout = std::chrono::milliseconds(flags.wait_timeout_ms);
  if (flags.node_rank >= 0) options.node_rank = flags.node_rank;
  options.num_nodes = flags.num_nodes;
  options.node_id = flags.node_id;
  options.coordinator = flags.coordinator;
  if (flags.cuda) {
    g_cuda_gradients = true;
#if GRADD_HAVE_CUDA
    if (RealGpu()) {
      // The trainer's own CUDA context (as torch's): the primary one.
      auto driver = gradd::cuda::CudaDriver::Get();
      if (!driver.ok()) {
        Line(absl::StrCat(
            "ERROR code=", static_cast<int>(driver.status().code()), " ",
            driver.status().message()));
        return 3;
      }
      if (auto s = gradd::cuda::UseDevice(**driver, 0, "trainer"); !s.ok()) {
        Line(absl::StrCat("ERROR code=", static_cast<int>(s.code()), " ",
                          s.message()));
        return 3;
      }
    }
#endif
    for (gradd::ClientParam& p : model) p.device = 1;
    options.cuda_device = 0;
  }
  auto client = gradd::Client::Attach(options, model);
  if (!client.ok()) {
    Line(absl::StrCat("ERROR code=", static_cast<int>(client.status().code()),
                      " ", client.status().message()));
    return 3;
  }
  Line(absl::StrCat("ATTACHED rank=", (*client)->global_rank(),
                    " world=", (*client)->world_size(),
                    " buckets=", (*client)->num_buckets(),
                    " params=", (*client)->num_params()));
  Trainer trainer(flags, std::move(model), std::move(client).value());
  return trainer.Run();
}
