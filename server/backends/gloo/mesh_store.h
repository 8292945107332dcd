// MeshStore: the Gloo store a GlooBackend forms its mesh through (GlooStore
// over the rendezvous store), with the test seam of the stranger race. Only
// gloo_backend.cc includes it.
#ifndef GRADD_SERVER_BACKENDS_GLOO_MESH_STORE_H_
#define GRADD_SERVER_BACKENDS_GLOO_MESH_STORE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "server/backends/gloo/authenticated_tcp.h"
#include "server/rendezvous/gloo_store.h"

namespace gradd {

// Test seam for the stranger race (tests/integration/multinode_test.cc,
// StrangerRacingThePairPortsDoesNotStopJobs): with
// GRADD_TEST_PAIR_PORT_STRANGERS=N in the daemon's environment, a node
// publishes its pair addresses (Gloo's set of its own mesh key, "<rank>")
// only once its pair port has refused N connections, or the connect timeout
// passed.
// Its real peers cannot connect before they read that key, so the stranger
// that races for the port is certain to reach it, and to have been refused,
// logged and counted, while the port still waits for the job's pairs.
// Unset (everywhere but that test): no wait, GlooStore as it is.
class MeshStore final : public GlooStore {
 public:
  MeshStore(RendezvousStoreInterface* store, std::string job_id,
            std::string prefix, std::chrono::milliseconds timeout,
            const PairAuthCounters* counters)
      : GlooStore(store, std::move(job_id), std::move(prefix), timeout),
        counters_(counters),
        timeout_(timeout),
        strangers_(StrangersToAwait()) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    // Only the pair addresses (key "<rank>"; Gloo sets others, such as its
    // host names, before its context listens).
    if (strangers_ > 0 && !key.empty() &&
        std::all_of(key.begin(), key.end(),
                    [](char c) { return c >= '0' && c <= '9'; })) {
      const auto until = std::chrono::steady_clock::now() + timeout_;
      while (counters_->refused.load() < strangers_ &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    GlooStore::set(key, data);
  }

 private:
  static uint64_t StrangersToAwait() {
    const char* value = std::getenv("GRADD_TEST_PAIR_PORT_STRANGERS");
    uint64_t n = 0;
    if (value == nullptr || !absl::SimpleAtoi(value, &n)) return 0;
    return n;
  }

  const PairAuthCounters* const counters_;
  const std::chrono::milliseconds timeout_;
  const uint64_t strangers_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_GLOO_MESH_STORE_H_
