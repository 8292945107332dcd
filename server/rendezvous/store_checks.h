// What every store behind RendezvousStoreInterface checks the same way, and
// says the same way: the built-in one (kv_store.h) and the one on etcd
// (etcd/etcd_store.h). Header-only, so that neither store's library needs
// the other's.
#ifndef GRADD_SERVER_RENDEZVOUS_STORE_CHECKS_H_
#define GRADD_SERVER_RENDEZVOUS_STORE_CHECKS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradd {

// Client-chosen text in a message: escaped, and cut after 64 bytes.
inline std::string ShownInMessage(absl::string_view s) {
  if (s.size() <= 64) return absl::CEscape(s);
  return absl::StrCat(absl::CEscape(s.substr(0, 64)), "...");
}

// A job id and a key: neither empty nor over rendezvous.limits.
// max_key_bytes (INVALID_ARGUMENT naming which, and how long).
inline absl::Status CheckStoreKey(absl::string_view job_id,
                                  absl::string_view key, size_t max_key_bytes) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("rendezvous: empty job id");
  }
  if (job_id.size() > max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: job id '", ShownInMessage(job_id), "' is ", job_id.size(),
        " bytes, over rendezvous.limits.max_key_bytes = ", max_key_bytes));
  }
  if (key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: empty key in job '", ShownInMessage(job_id), "'"));
  }
  if (key.size() > max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: key '", ShownInMessage(key), "' in job '",
        ShownInMessage(job_id), "' is ", key.size(),
        " bytes, over rendezvous.limits.max_key_bytes = ", max_key_bytes));
  }
  return absl::OkStatus();
}

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_STORE_CHECKS_H_
