// One rank of a job through the installed C++ API (gradd/client.h):
//   consumer_cpp SOCKET JOB LOCAL_RANK LOCAL_WORLD_SIZE
// Every rank r writes r + 1 into every gradient; after WaitAll each holds
// the average, (world + 1) / 2. Prints "consumer_cpp OK" and exits 0, or
// prints the error and exits 1.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gradd/client.h"
#include "gradd/version.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s SOCKET JOB LOCAL_RANK LOCAL_WORLD_SIZE\n",
                 argv[0]);
    return 2;
  }
  gradd::ClientOptions options;
  options.socket_path = argv[1];
  options.job_id = argv[2];
  options.local_rank = std::atoi(argv[3]);
  options.local_world_size = std::atoi(argv[4]);
  options.connect_timeout = std::chrono::milliseconds(2000);
  options.attach_timeout = std::chrono::milliseconds(20000);
  const std::vector<gradd::ClientParam> params = {
      {"fc.weight", {4, 3}, gradd::dtype::kFloat32},
      {"fc.bias", {4}, gradd::dtype::kFloat32},
  };
  absl::StatusOr<std::unique_ptr<gradd::Client>> client =
      gradd::Client::Attach(options, params);
  if (!client.ok()) {
    std::fprintf(stderr, "consumer_cpp: %s\n",
                 client.status().ToString().c_str());
    return 1;
  }
  const float mine = static_cast<float>(options.local_rank + 1);
  const float want = (options.local_world_size + 1) / 2.0f;
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < (*client)->num_params(); ++i) {
      float* g = static_cast<float*>((*client)->gradient(i));
      for (size_t j = 0; j < (*client)->gradient_bytes(i) / sizeof(float); ++j)
        g[j] = mine;
      if (absl::Status s = (*client)->MarkReady(i); !s.ok()) {
        std::fprintf(stderr, "consumer_cpp: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    if (absl::Status s = (*client)->WaitAll(); !s.ok()) {
      std::fprintf(stderr, "consumer_cpp: %s\n", s.ToString().c_str());
      return 1;
    }
    for (int i = 0; i < (*client)->num_params(); ++i) {
      const float* g = static_cast<const float*>((*client)->gradient(i));
      if (g[0] != want) {
        std::fprintf(stderr, "consumer_cpp: param %d is %g, want %g\n", i, g[0],
                     want);
        return 1;
      }
    }
  }
  std::printf("consumer_cpp OK (gradd %s)\n", GRADD_VERSION_STRING);
  return 0;
}
