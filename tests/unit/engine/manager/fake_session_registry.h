// In-memory SessionRegistryInterface for engine tests: sessions are ids the
// test opens and closes by hand; fds "sent" to a session are dup'ed and kept
// for the test to map, as a trainer would.
#ifndef GRADD_TESTS_UNIT_ENGINE_MANAGER_FAKE_SESSION_REGISTRY_H_
#define GRADD_TESTS_UNIT_ENGINE_MANAGER_FAKE_SESSION_REGISTRY_H_

#include <unistd.h>

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/shm.h"
#include "server/engine/manager/session_registry.h"

namespace gradd {

class FakeSessionRegistry final : public SessionRegistryInterface {
 public:
  struct Sent {
    uint64_t attach_id = 0;
    std::vector<UniqueFd> fds;
  };

  void set_observer(SessionObserverInterface* observer) {
    observer_ = observer;
  }

  uint64_t Open() {
    absl::MutexLock lock(&mu_);
    uint64_t id = next_++;
    live_.insert(id);
    return id;
  }

  // The trainer's socket closed: tells the observer, as the listener would.
  void Close(uint64_t id) {
    {
      absl::MutexLock lock(&mu_);
      live_.erase(id);
    }
    if (observer_ != nullptr) observer_->OnSessionClosed(id);
  }

  // The socket closed, but the observer is told only by NotifyClosed (the
  // listener noticed before the job manager heard of it).
  void CloseQuietly(uint64_t id) {
    absl::MutexLock lock(&mu_);
    live_.erase(id);
  }
  void NotifyClosed(uint64_t id) {
    if (observer_ != nullptr) observer_->OnSessionClosed(id);
  }

  bool IsLive(uint64_t id) const override {
    absl::MutexLock lock(&mu_);
    return live_.contains(id);
  }

  absl::Status SendFds(uint64_t id, uint64_t attach_id,
                       const std::vector<int>& fds) override {
    absl::MutexLock lock(&mu_);
    if (!live_.contains(id)) {
      return absl::UnavailableError(absl::StrCat("session ", id, " closed"));
    }
    Sent sent;
    sent.attach_id = attach_id;
    for (int fd : fds) sent.fds.emplace_back(dup(fd));
    sent_[id] = std::move(sent);
    return absl::OkStatus();
  }

  // Counts the Unclaims (the engine gave the session back).
  void Unclaim(uint64_t id) override {
    absl::MutexLock lock(&mu_);
    ++unclaims_[id];
  }
  int unclaims(uint64_t id) const {
    absl::MutexLock lock(&mu_);
    auto it = unclaims_.find(id);
    return it == unclaims_.end() ? 0 : it->second;
  }

  // The fds sent to session `id` (moved out), or empty.
  Sent TakeSent(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = sent_.find(id);
    if (it == sent_.end()) return {};
    Sent out = std::move(it->second);
    sent_.erase(it);
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 100;
  absl::flat_hash_set<uint64_t> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Sent> sent_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int> unclaims_ ABSL_GUARDED_BY(mu_);
  SessionObserverInterface* observer_ = nullptr;
};

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ENGINE_MANAGER_FAKE_SESSION_REGISTRY_H_
