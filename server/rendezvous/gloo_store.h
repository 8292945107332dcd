// GlooStore: gloo::rendezvous::Store over a RendezvousStoreInterface, so a
// gloo::rendezvous::Context can connectFullMesh through the coordinator.
// Every Gloo key is stored as "<prefix>/<key>" in job `job_id`'s namespace;
// use a fresh prefix for every new Gloo context of a job (e.g. one carrying
// a generation number) so stale addresses are never read.
//
// Gloo's Store contract reports errors by throwing: set/get/wait throw
// gloo::IoException carrying the rendezvous error's message. Callers of Gloo
// (GlooBackend) catch at their edge; nothing else in gradd sees the throw.
//
// Thread-safety: as the underlying store (thread-safe); the value cache used
// by Published() is mutex-protected.
#ifndef GRADD_SERVER_RENDEZVOUS_GLOO_STORE_H_
#define GRADD_SERVER_RENDEZVOUS_GLOO_STORE_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gloo/rendezvous/store.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // `store` must outlive this object. `default_timeout` bounds get() and the
  // timeout-less wait().
  GlooStore(RendezvousStoreInterface* store, std::string job_id,
            std::string prefix, std::chrono::milliseconds default_timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The last value this object set or got for `key` (un-prefixed), if any.
  // Lets the backend learn what peers published without another round trip.
  std::optional<std::vector<char>> Published(const std::string& key) const;

  std::string FullKey(const std::string& key) const;

 private:
  RendezvousStoreInterface* const store_;
  const std::string job_id_;
  const std::string prefix_;
  const std::chrono::milliseconds default_timeout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<char>> seen_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_GLOO_STORE_H_
