// FakeRendezvousStore: a RendezvousStoreInterface (store_interface.h) for
// tests, over its own in-process KvStore or over another store (a
// RendezvousClient, a KvStore several fakes share). It remembers every key
// written and every counter moved (to check what a closer deletes), can
// play a store with leases and transactions (etcd's), and can run a hook
// before each Set (a test's attack on what a node publishes).
//
// Tests only: header-only, in the CMake target gradd_rendezvous_testing,
// which no library of the daemon links.
#ifndef GRADD_SERVER_RENDEZVOUS_FAKE_STORE_H_
#define GRADD_SERVER_RENDEZVOUS_FAKE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

class FakeRendezvousStore : public RendezvousStoreInterface {
 public:
  struct Options {
    // Play a store with leases and transactions (etcd,
    // formation/reformation_agreement.h): SetOwn's keys are the daemons'
    // liveness (a test deletes one to play its lease expiring),
    // CompareAndSet is atomic against itself, and keys go by prefix.
    // Otherwise those are the interface's defaults (the built-in store's
    // answers: no leases, UNIMPLEMENTED).
    bool leased = false;
    // The store the calls go to (not owned; must outlive this one); null:
    // this fake's own in-process KvStore.
    RendezvousStoreInterface* inner = nullptr;
    // Called with each key and value before Set passes them on.
    std::function<void(absl::string_view key, absl::string_view value)>
        before_set;
  };

  FakeRendezvousStore() : FakeRendezvousStore(Options()) {}
  explicit FakeRendezvousStore(Options options)
      : options_(std::move(options)),
        store_(options_.inner != nullptr ? options_.inner : &kv_) {}

  bool HasLeases() const override { return options_.leased; }
  absl::Status SetOwn(absl::string_view job, absl::string_view key,
                      absl::string_view value) override {
    return Set(job, key, value);
  }
  absl::StatusOr<bool> CompareAndSet(
      absl::string_view job, absl::string_view key,
      std::optional<std::string> expected, absl::string_view value,
      absl::Span<const std::pair<std::string, std::string>> also) override {
    if (!options_.leased) {
      return RendezvousStoreInterface::CompareAndSet(job, key, expected, value,
                                                     also);
    }
    absl::MutexLock cas(&cas_mu_);
    absl::StatusOr<std::string> now =
        store_->Get(job, key, absl::ZeroDuration());
    const std::optional<std::string> held =
        now.ok() ? std::optional<std::string>(*now) : std::nullopt;
    {
      absl::MutexLock lock(&mu_);
      ++swaps_tried_;
    }
    if (held != expected) return false;
    for (const auto& [k, v] : also) {
      if (absl::Status s = Set(job, k, v); !s.ok()) return s;
    }
    if (absl::Status s = Set(job, key, value); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    ++swaps_won_;
    return true;
  }
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view job,
                                       absl::string_view prefix) override {
    if (!options_.leased) {
      return RendezvousStoreInterface::DeletePrefix(job, prefix);
    }
    int64_t n = 0;
    for (const std::string& key : Written()) {
      if (absl::StartsWith(key, prefix) &&
          store_->Delete(job, key).value_or(false)) {
        ++n;
      }
    }
    return n;
  }
  absl::StatusOr<int64_t> CountPrefix(absl::string_view job,
                                      absl::string_view prefix) override {
    if (!options_.leased) {
      return RendezvousStoreInterface::CountPrefix(job, prefix);
    }
    int64_t n = 0;
    for (const std::string& key : Written()) {
      if (absl::StartsWith(key, prefix) &&
          store_->Get(job, key, absl::ZeroDuration()).ok()) {
        ++n;
      }
    }
    return n;
  }

  absl::Status Set(absl::string_view job, absl::string_view key,
                   absl::string_view value) override {
    if (options_.before_set) options_.before_set(key, value);
    Record(key);
    return store_->Set(job, key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view job, absl::string_view key,
                                  absl::Duration timeout) override {
    return store_->Get(job, key, timeout);
  }
  absl::StatusOr<int64_t> Add(absl::string_view job, absl::string_view key,
                              int64_t delta) override {
    Record(key);
    if (delta != 0) {
      absl::MutexLock lock(&mu_);
      added_.insert(std::string(key));
    }
    return store_->Add(job, key, delta);
  }
  absl::Status Wait(absl::string_view job, absl::Span<const std::string> keys,
                    absl::Duration timeout) override {
    return store_->Wait(job, keys, timeout);
  }
  absl::StatusOr<bool> Delete(absl::string_view job,
                              absl::string_view key) override {
    return store_->Delete(job, key);
  }
  std::string Describe() const override { return store_->Describe(); }

  // The own KvStore's (options.inner null).
  size_t NumKeys(absl::string_view job) const { return kv_.NumKeys(job); }
  void DeleteJob(absl::string_view job) { kv_.DeleteJob(job); }

  // Every key written (Set, SetOwn, Add), sorted.
  std::vector<std::string> Written() const {
    absl::MutexLock lock(&mu_);
    return {written_.begin(), written_.end()};
  }
  // Counters moved by Add (not just read).
  std::vector<std::string> Added() const {
    absl::MutexLock lock(&mu_);
    return {added_.begin(), added_.end()};
  }
  int SwapsTried() const {
    absl::MutexLock lock(&mu_);
    return swaps_tried_;
  }
  int SwapsWon() const {
    absl::MutexLock lock(&mu_);
    return swaps_won_;
  }

 private:
  void Record(absl::string_view key) {
    absl::MutexLock lock(&mu_);
    written_.insert(std::string(key));
  }

  const Options options_;
  KvStore kv_;
  RendezvousStoreInterface* const store_;
  absl::Mutex cas_mu_;
  mutable absl::Mutex mu_;
  std::set<std::string> written_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> added_ ABSL_GUARDED_BY(mu_);
  int swaps_tried_ ABSL_GUARDED_BY(mu_) = 0;
  int swaps_won_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_FAKE_STORE_H_
