// Internal to formation/ (reformation*.cc): the store keys of re-formation
// (reformation.h lays them out) and the small helpers every part of it
// uses.
#ifndef GRADD_SERVER_ENGINE_FORMATION_REFORMATION_KEYS_H_
#define GRADD_SERVER_ENGINE_FORMATION_REFORMATION_KEYS_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/engine/formation/reformation.h"
#include "server/rendezvous/store_interface.h"

namespace gradd::reformation_internal {

// The closer (built-in store) adds this to "joined": every later Add(1)
// returns more than it, so an entrant knows at once that it came too late
// (and the closer reads the entrant count back as the sum minus the bias).
inline constexpr int64_t kClosedBias = int64_t{1} << 40;
// A key that is there, or not: the store's answer, not a wait.
inline constexpr absl::Duration kProbe = absl::Milliseconds(1);
// A key another node writes right after a counter it already bumped (a
// slot id after "joined", an arrival's member after "arrivals").
inline constexpr absl::Duration kFollowUp = absl::Seconds(2);
// How often a node waiting for the others looks at the store again (the
// built-in store's beats; etcd's liveness keys and the verdict).
inline constexpr absl::Duration kPulseStep = absl::Milliseconds(100);

inline absl::Status Prefixed(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

inline std::string Where(const ReformOptions& o) {
  return absl::StrCat("re-forming job '", o.job_id, "' (epoch ", o.epoch,
                      ") on node '", o.node_id, "'");
}

inline absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// The keys of one epoch (see reformation.h).
struct EpochKeys {
  std::string prefix;

  std::string Joined() const { return absl::StrCat(prefix, "/joined"); }
  std::string Slot(int64_t i) const {
    return absl::StrCat(prefix, "/slot/", i);
  }
  std::string Member(const std::string& id) const {
    return absl::StrCat(prefix, "/member/", id);
  }
  std::string Closed() const { return absl::StrCat(prefix, "/closed"); }
  std::string Members() const { return absl::StrCat(prefix, "/members"); }
  std::string Plan() const { return absl::StrCat(prefix, "/plan"); }
  std::string Gloo() const { return absl::StrCat(prefix, "/gloo"); }
};

inline EpochKeys KeysOf(const std::string& reformation_prefix, uint64_t epoch) {
  return EpochKeys{absl::StrCat(reformation_prefix, "/epoch", epoch)};
}
inline std::string ArrivalsKey(const std::string& reformation_prefix) {
  return absl::StrCat(reformation_prefix, "/arrivals");
}
inline std::string ArrivalKey(const std::string& reformation_prefix,
                              int64_t n) {
  return absl::StrCat(reformation_prefix, "/arrival/", n);
}
inline std::string AliveKey(const std::string& reformation_prefix,
                            const std::string& node_id) {
  return absl::StrCat(reformation_prefix, "/alive/", node_id);
}
inline std::string LastEpochKey(const std::string& reformation_prefix) {
  return absl::StrCat(reformation_prefix, "/epoch");
}
inline std::string RunningKey(const std::string& reformation_prefix) {
  return absl::StrCat(reformation_prefix, "/running");
}

// Whether this node ran the previous epoch (else it is an arrival).
inline bool IsSurvivor(const ReformOptions& o) {
  return std::any_of(o.previous.begin(), o.previous.end(),
                     [&](const JobNode& n) { return n.node_id == o.node_id; });
}

// The value of `key`, or nullopt when it is not there within `wait`.
inline absl::StatusOr<std::optional<std::string>> Probe(
    RendezvousStoreInterface& store, const std::string& job,
    const std::string& key, absl::Duration wait) {
  absl::StatusOr<std::string> value = store.Get(job, key, wait);
  if (value.ok()) return std::optional<std::string>(*std::move(value));
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return std::optional<std::string>();
  }
  return value.status();
}

}  // namespace gradd::reformation_internal

#endif  // GRADD_SERVER_ENGINE_FORMATION_REFORMATION_KEYS_H_
