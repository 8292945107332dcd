// What other threads hand a re-formable job's engine about its inter-node
// group (job.h "Elastic multi-node jobs"; job_reformation.cc): the first
// error a reducer completion met since the engine last looked (the break's
// reason), a request to break (a node asks to be admitted), and the result
// of the re-formation the engine's handler started. Also the two messages
// of that hand-over: what the engine tells the handler at a break
// (ReformationRequest) and what the re-formation answers
// (ReformationResult).
//
// Threads: Post* from any thread (a completion, the manager's arrival
// watcher, a formation thread); they leave word under the inbox's mutex,
// set its flag and wake the engine. pending() and Take() on the engine
// thread: the engine's loop reads one atomic while nothing is there. After
// Close() (the job stopped) nothing is kept: a result is destroyed at once
// (its reducer never ran anything).
#ifndef GRADD_SERVER_ENGINE_JOB_REFORMATION_INBOX_H_
#define GRADD_SERVER_ENGINE_JOB_REFORMATION_INBOX_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/job/mailbox.h"
#include "server/engine/observe/job_events.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

// The engine's word to the re-formation handler once the reducer drained
// after a break (Job::ReformationRequest).
struct ReformationRequest {
  std::string reason;
  uint64_t completed_iteration = 0;  // every bucket done for it
  uint64_t sync_seq = 0;
  uint64_t epoch = 0;  // the epoch being left
  // The local ranks whose return made this node break (rank restart).
  std::vector<int> restarted_local_ranks;
};

// What a re-formation made of the job's group (Job::ReformationResult).
struct ReformationResult {
  std::unique_ptr<BucketReducerInterface> reducer;
  uint64_t epoch = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int world_size = 1;  // live global world size
  std::vector<std::string> node_ids;
  std::string store_prefix;
  uint64_t sync_seq = 0;
  bool behind = false;
  std::vector<std::string> lost;
  std::vector<std::string> admitted;
  // What the re-formation was, the same on every node (Reformed).
  ReformCause cause = ReformCause::kUnknown;
  std::string reason;
  // Every node lost and not back (Reformed::departed); with kUnknown
  // (an older closer) the lists are kept from lost and admitted.
  std::vector<std::string> departed;
};

class ReformationInbox final : public Mailbox {
 public:
  // `wake` rings the engine (called after each post, outside the lock).
  explicit ReformationInbox(absl::AnyInvocable<void()> wake)
      : Mailbox(std::move(wake)) {}

  // Any thread. A reducer completion failed (`what` names the work): the
  // first error since the last Take is the break's reason; the rest of a
  // drain echoes it (the hierarchical reducer fails everything after it).
  void PostError(std::string what);
  // Any thread. Break at the next quiet point for `reason`; the first
  // request since the last Take is kept.
  void PostRequest(std::string reason);
  // Any thread. The outcome of the re-formation the handler started; one
  // not taken yet is replaced.
  void PostResult(absl::StatusOr<ReformationResult> result);

  // pending(): something was posted since the last Take.
  struct Taken {
    std::optional<std::string> error;
    std::optional<std::string> request;
    std::optional<absl::StatusOr<ReformationResult>> result;
  };
  // Engine thread: everything posted since the last Take (nothing at all,
  // without locking, when pending() is false).
  Taken Take();

  // The job stopped: drops what is here and everything posted from now on.
  void Close();

 private:
  // The error and the request: the first of each since the last Take.
  enum Word { kError = 0, kRequest = 1 };
  void PostFirst(Word word, std::string text);

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::string> words_[2] ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<ReformationResult>> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_REFORMATION_INBOX_H_
