// A trainer process for the collective integration tests: attaches to a
// real gradd through the C ABI (gradd.h) and runs every collective of every
// dtype class, sized to need several rounds through a small collective
// area, checking each result exactly against its closed form.
//
// Output (stdout, one line each, flushed):
//   ATTACHED rank=R world=W
//   COLLECTIVES_OK rank=R world=W checks=N
//   ERROR code=C <message>              exit 3
//   MISMATCH <what>                     exit 4
// Exit codes: 0 pass, 2 usage, 3 gradd error, 4 wrong value, 5 a bad call
// unexpectedly succeeded.
//
// Values: element i of global rank r (world W, S = W (W + 1) / 2):
//   floats  (r + 1) * f(i),  f(i) = i mod 7 - 3
//   ints    (r + 1) * h(i),  h(i) = i mod 5 - 2 (uint8: i mod 5)
// so sum = S f(i), min / max = f(i) or W f(i) by sign, avg = (W + 1) f / 2:
// small integers (or halves) exact in every dtype including bfloat16.
//
// Modes: all (default); mismatch_op (local rank 1 asks for max where the
// others sum: everyone must get INVALID_ARGUMENT naming both ranks);
// mismatch_size (local rank 1 passes one element more).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradd/gradd.h"

namespace {

struct Flags {
  std::string socket;
  std::string job = "coll";
  int local_rank = 0;
  int local_world_size = 1;
  int num_nodes = 0;
  int64_t collective_bytes = 4096;
  int64_t count = 3001;
  int params = 0;
  std::string mode = "all";
};

int checks = 0;
gradd_client* client = nullptr;
int rank = 0;
int world = 1;

[[noreturn]] void Die(int code, const std::string& what) {
  std::printf("ERROR code=%d %s: %s\n", code, what.c_str(), gradd_last_error());
  std::fflush(stdout);
  std::exit(3);
}

[[noreturn]] void Mismatch(const std::string& what) {
  std::printf("MISMATCH %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(4);
}

void Ok(int code, const std::string& what) {
  if (code != GRADD_OK) Die(code, what);
}

// Half-precision helpers (the tests' own, not the library's).
uint16_t FloatToHalfExact(float f) {
  // Only small integers and halves are converted: exact.
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  const uint32_t mant = (bits >> 13) & 0x3ff;
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}
float HalfToFloatExact(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0 && mant == 0) {
    float z = 0;
    std::memcpy(&z, &sign, 4);
    return z;
  }
  const uint32_t bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t FloatToBf16Exact(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}
float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double F(int64_t i) { return static_cast<double>(i % 7) - 3; }
int64_t H(int64_t i, bool unsigned_type) {
  return unsigned_type ? i % 5 : i % 5 - 2;
}

double Expected(int op, double f) {
  const double s = world * (world + 1) / 2.0;
  switch (op) {
    case GRADD_SUM:
      return s * f;
    case GRADD_AVG:
      return s * f / world;
    case GRADD_MIN:
      return f >= 0 ? f : world * f;
    default:
      return f >= 0 ? world * f : f;
  }
}

const char* OpName(int op) {
  static const char* names[] = {"sum", "avg", "min", "max"};
  return names[op];
}

// Writes rank `r`'s value of element i as `dtype` into p[i].
void Put(int dtype, void* p, int64_t i, int r) {
  const double v = (r + 1) * F(i);
  switch (dtype) {
    case GRADD_FLOAT32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case GRADD_FLOAT64:
      static_cast<double*>(p)[i] = v;
      break;
    case GRADD_FLOAT16:
      static_cast<uint16_t*>(p)[i] = FloatToHalfExact(static_cast<float>(v));
      break;
    case GRADD_BFLOAT16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16Exact(static_cast<float>(v));
      break;
    case GRADD_INT32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>((r + 1) * H(i, false));
      break;
    case GRADD_INT64:
      // Large values: exercises 64-bit arithmetic.
      static_cast<int64_t*>(p)[i] = (r + 1) * H(i, false) * (int64_t{1} << 40);
      break;
    case GRADD_UINT8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>((r + 1) * H(i, true));
      break;
    case GRADD_INT8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>((r + 1) * H(i, false));
      break;
  }
}

double Get(int dtype, const void* p, int64_t i) {
  switch (dtype) {
    case GRADD_FLOAT32:
      return static_cast<const float*>(p)[i];
    case GRADD_FLOAT64:
      return static_cast<const double*>(p)[i];
    case GRADD_FLOAT16:
      return HalfToFloatExact(static_cast<const uint16_t*>(p)[i]);
    case GRADD_BFLOAT16:
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case GRADD_INT32:
      return static_cast<const int32_t*>(p)[i];
    case GRADD_INT64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i] /
                                 (int64_t{1} << 40));
    case GRADD_UINT8:
      return static_cast<const uint8_t*>(p)[i];
    default:
      return static_cast<const int8_t*>(p)[i];
  }
}

double Base(int dtype, int64_t i) {
  if (dtype >= GRADD_INT32) return H(i, dtype == GRADD_UINT8);
  return F(i);
}

size_t Size(int dtype) {
  switch (dtype) {
    case GRADD_FLOAT64:
    case GRADD_INT64:
      return 8;
    case GRADD_FLOAT32:
    case GRADD_INT32:
      return 4;
    case GRADD_FLOAT16:
    case GRADD_BFLOAT16:
      return 2;
    default:
      return 1;
  }
}

void CheckAllreduce(int dtype, int op, int64_t count) {
  std::vector<char> buf(count * Size(dtype) + 1);
  for (int64_t i = 0; i < count; ++i) Put(dtype, buf.data(), i, rank);
  Ok(gradd_allreduce(client, buf.data(), count, dtype, op),
     std::string("allreduce ") + OpName(op) + " dtype " +
         std::to_string(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const double want = Expected(op, Base(dtype, i));
    const double got = Get(dtype, buf.data(), i);
    if (got != want) {
      Mismatch("allreduce " + std::string(OpName(op)) + " dtype " +
               std::to_string(dtype) + " element " + std::to_string(i) +
               ": got " + std::to_string(got) + ", want " +
               std::to_string(want));
    }
  }
  ++checks;
}

void CheckAllgather(int64_t bytes) {
  std::vector<uint8_t> in(bytes + 1), out(bytes * world + 1, 0xee);
  auto byte = [](int r, int64_t j) {
    return static_cast<uint8_t>((r * 31 + j * 7 + j / 251) & 0xff);
  };
  for (int64_t j = 0; j < bytes; ++j) in[j] = byte(rank, j);
  Ok(gradd_allgather(client, in.data(), bytes, out.data()), "allgather");
  for (int r = 0; r < world; ++r) {
    for (int64_t j = 0; j < bytes; ++j) {
      if (out[r * bytes + j] != byte(r, j)) {
        Mismatch("allgather block " + std::to_string(r) + " byte " +
                 std::to_string(j));
      }
    }
  }
  ++checks;
}

void CheckReduceScatter(int dtype, int op, int64_t count) {
  const size_t es = Size(dtype);
  std::vector<char> in(count * world * es + 1), out(count * es + 1);
  // Element i of block j is element j * count + i of the whole input.
  for (int64_t k = 0; k < count * world; ++k) Put(dtype, in.data(), k, rank);
  Ok(gradd_reduce_scatter(client, in.data(), out.data(), count, dtype, op),
     std::string("reduce_scatter ") + OpName(op));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = rank * count + i;
    const double want = Expected(op, Base(dtype, k));
    const double got = Get(dtype, out.data(), i);
    if (got != want) {
      Mismatch("reduce_scatter " + std::string(OpName(op)) + " dtype " +
               std::to_string(dtype) + " element " + std::to_string(i) +
               ": got " + std::to_string(got) + ", want " +
               std::to_string(want));
    }
  }
  ++checks;
}

void CheckBroadcast(int64_t bytes, int root) {
  std::vector<uint8_t> data(bytes + 1);
  for (int64_t j = 0; j < bytes; ++j) {
    data[j] = static_cast<uint8_t>(rank == root ? (j * 13 + root) & 0xff : 0);
  }
  Ok(gradd_broadcast(client, data.data(), bytes, root), "broadcast");
  for (int64_t j = 0; j < bytes; ++j) {
    if (data[j] != static_cast<uint8_t>((j * 13 + root) & 0xff)) {
      Mismatch("broadcast byte " + std::to_string(j));
    }
  }
  ++checks;
}

bool Parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--socket") {
      f->socket = v;
    } else if (a == "--job") {
      f->job = v;
    } else if (a == "--local-rank") {
      f->local_rank = std::atoi(v.c_str());
    } else if (a == "--local-world-size") {
      f->local_world_size = std::atoi(v.c_str());
    } else if (a == "--num-nodes") {
      f->num_nodes = std::atoi(v.c_str());
    } else if (a == "--collective-bytes") {
      f->collective_bytes = std::atoll(v.c_str());
    } else if (a == "--count") {
      f->count = std::atoll(v.c_str());
    } else if (a == "--params") {
      f->params = std::atoi(v.c_str());
    } else if (a == "--mode") {
      f->mode = v;
    } else {
      return false;
    }
  }
  return argc % 2 == 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, &f)) {
    std::fprintf(stderr, "usage: %s --socket S [--job J ...]\n", argv[0]);
    return 2;
  }
  gradd_options opts;
  gradd_options_init(&opts);
  opts.socket_path = f.socket.c_str();
  opts.job_id = f.job.c_str();
  opts.local_rank = f.local_rank;
  opts.local_world_size = f.local_world_size;
  opts.num_nodes = f.num_nodes;
  opts.attach_timeout_ms = 30000;
  opts.wait_timeout_ms = 30000;
  opts.collective_bytes = static_cast<size_t>(f.collective_bytes);
  // --params N: a job with gradients too (one bucket), which runs an
  // iteration between the collectives.
  const int64_t shape[1] = {16};
  std::vector<gradd_param> params;
  std::vector<std::string> names;
  for (int p = 0; p < f.params; ++p) {
    names.push_back(std::string("w").append(std::to_string(p)));
  }
  for (int p = 0; p < f.params; ++p) {
    params.push_back(gradd_param{names[p].c_str(), shape, 1, GRADD_FLOAT32});
  }
  Ok(gradd_attach(&opts, params.data(), params.size(), &client), "attach");
  rank = gradd_rank(client);
  world = gradd_world_size(client);
  std::printf("ATTACHED rank=%d world=%d\n", rank, world);
  std::fflush(stdout);

  if (f.mode == "mismatch_op" || f.mode == "mismatch_size") {
    std::vector<float> v(f.count, 1.0f);
    int op = GRADD_SUM;
    size_t count = f.count;
    if (rank == 1) {
      if (f.mode == "mismatch_op") op = GRADD_MAX;
      if (f.mode == "mismatch_size") count -= 1;
    }
    const int code =
        gradd_allreduce(client, v.data(), count, GRADD_FLOAT32, op);
    if (code == GRADD_OK) {
      std::printf("UNEXPECTED_OK\n");
      std::fflush(stdout);
      return 5;
    }
    Die(code, "mismatched allreduce");
  }

  // Bad calls fail locally, without a round (so the job goes on).
  if (gradd_allreduce(client, nullptr, 0, GRADD_INT32, GRADD_AVG) !=
      GRADD_INVALID_ARGUMENT) {
    Mismatch("avg of int32 was not refused");
  }
  if (gradd_allreduce(client, nullptr, 0, 42, GRADD_SUM) !=
      GRADD_INVALID_ARGUMENT) {
    Mismatch("dtype 42 was not refused");
  }

  const int64_t n = f.count;
  const int floats[] = {GRADD_FLOAT32, GRADD_FLOAT64, GRADD_FLOAT16,
                        GRADD_BFLOAT16};
  const int ints[] = {GRADD_INT32, GRADD_INT64, GRADD_UINT8, GRADD_INT8};
  for (int dtype : floats) {
    for (int op : {GRADD_SUM, GRADD_AVG, GRADD_MIN, GRADD_MAX}) {
      CheckAllreduce(dtype, op, n);
    }
  }
  for (int dtype : ints) {
    for (int op : {GRADD_SUM, GRADD_MIN, GRADD_MAX}) {
      CheckAllreduce(dtype, op, n);
    }
  }
  if (f.params > 0) {
    // A gradient iteration between collectives: both sequences coexist.
    for (int p = 0; p < f.params; ++p) {
      float* g = static_cast<float*>(gradd_gradient(client, p));
      for (int j = 0; j < 16; ++j) g[j] = static_cast<float>(rank);
      Ok(gradd_mark_ready(client, p), "mark_ready");
    }
    Ok(gradd_wait_all(client), "wait_all");
    const float* g = static_cast<const float*>(gradd_gradient(client, 0));
    if (g[0] != (world - 1) / 2.0f) Mismatch("gradient average");
    ++checks;
  }
  CheckAllreduce(GRADD_FLOAT32, GRADD_SUM, 0);  // empty: still a round
  CheckAllreduce(GRADD_INT64, GRADD_MAX, 1);
  CheckAllgather(n);
  CheckAllgather(1);
  CheckAllgather(0);
  CheckReduceScatter(GRADD_FLOAT32, GRADD_SUM, n / 3 + 1);
  CheckReduceScatter(GRADD_BFLOAT16, GRADD_AVG, n / 5 + 1);
  CheckReduceScatter(GRADD_INT32, GRADD_MIN, n / 2);
  CheckReduceScatter(GRADD_INT8, GRADD_MAX, 7);
  CheckBroadcast(3 * f.collective_bytes + 17, world - 1);
  Ok(gradd_barrier(client), "barrier");
  ++checks;
  Ok(gradd_barrier(client), "barrier");
  ++checks;
  std::printf("COLLECTIVES_OK rank=%d world=%d checks=%d\n", rank, world,
              checks);
  std::fflush(stdout);
  gradd_free(client);
  return 0;
}
