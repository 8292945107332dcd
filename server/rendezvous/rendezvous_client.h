// RendezvousClient: gradd.v1.Rendezvous over gRPC/TCP, as a
// RendezvousStoreInterface.
//
// Every RPC carries a deadline. A call that fails with UNAVAILABLE (the
// coordinator is not up yet, restarting, or unreachable) is retried with
// exponential backoff until Options::connect_timeout has passed since the
// call began (Set, Add, Delete) or until the call's own timeout (Get, Wait);
// then the error names the coordinator's address. Blocking calls are split
// into server-side waits of at most Options::max_wait_per_rpc each, so long
// waits survive a server that caps them.
//
// Add is retried on UNAVAILABLE too; gRPC reports UNAVAILABLE only when the
// request did not reach the server in the cases that matter here (connection
// refused / not yet established), which is what a late coordinator produces.
//
// Credentials: with Options::credentials every channel and call carries
// what the coordinator demands (server/auth/node_credentials.h); without,
// plaintext and no token (rendezvous.insecure, tests). The coordinator
// refusing them is UNAUTHENTICATED, never retried.
//
// Thread-safety: all methods may be called concurrently (one channel).
#ifndef GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_CLIENT_H_
#define GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gradd/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/auth/node_credentials.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

class RendezvousClient : public RendezvousStoreInterface {
 public:
  struct Options {
    // host:port of the coordinator.
    std::string address;
    // Deadline of one non-blocking RPC (Set, Add, Delete) attempt.
    absl::Duration rpc_timeout = absl::Seconds(10);
    // How long a call keeps retrying while the coordinator is unavailable.
    absl::Duration connect_timeout = absl::Seconds(60);
    // Longest single server-side wait of a blocking call.
    absl::Duration max_wait_per_rpc = absl::Seconds(10);
    // Extra RPC deadline beyond a blocking call's server-side wait, so the
    // server's answer (naming missing keys) beats the transport's deadline.
    absl::Duration response_grace = absl::Seconds(2);
    absl::Duration initial_backoff = absl::Milliseconds(20);
    absl::Duration max_backoff = absl::Seconds(1);
    // Largest message, both directions (the store's largest value,
    // rendezvous.limits.max_value_bytes, plus room for the rest).
    int max_message_bytes = (32 << 20) + (1 << 20);
    // What this daemon presents to the coordinator; null: nothing.
    std::shared_ptr<const NodeCredentials> credentials;
  };

  // Creates the channel (connects lazily). INVALID_ARGUMENT for an empty
  // address.
  static absl::StatusOr<std::unique_ptr<RendezvousClient>> Create(
      const Options& options);

  [[nodiscard]] absl::Status Set(absl::string_view job_id,
                                 absl::string_view key,
                                 absl::string_view value) override;
  [[nodiscard]] absl::StatusOr<std::string> Get(
      absl::string_view job_id, absl::string_view key,
      absl::Duration timeout) override;
  [[nodiscard]] absl::StatusOr<int64_t> Add(absl::string_view job_id,
                                            absl::string_view key,
                                            int64_t delta) override;
  [[nodiscard]] absl::Status Wait(absl::string_view job_id,
                                  absl::Span<const std::string> keys,
                                  absl::Duration timeout) override;
  [[nodiscard]] absl::StatusOr<bool> Delete(absl::string_view job_id,
                                            absl::string_view key) override;
  std::string Describe() const override;
  // Tells the coordinator that node `node_id` is done with `round` of
  // `job_id`, a job of `num_nodes` nodes (KvStore::Release): once every node
  // has, the coordinator deletes the round's keys. One attempt, bounded by
  // rpc_timeout and 2 s. Returns whether the keys were deleted.
  [[nodiscard]] absl::StatusOr<bool> Release(absl::string_view job_id,
                                             absl::string_view round,
                                             absl::string_view node_id,
                                             int num_nodes) override;
  // Makes the destructor Release(...) (best effort, logged at debug level
  // when it fails): a formed job keeps its store client exactly as long as
  // it runs on this node, so the coordinator learns when it ended here.
  void ReleaseRoundWhenDone(std::string job_id, std::string round,
                            std::string node_id, int num_nodes) override;
  ~RendezvousClient() override;

  const std::string& address() const { return options_.address; }

 private:
  explicit RendezvousClient(const Options& options);

  using Attempt =
      std::function<grpc::Status(grpc::ClientContext*, absl::Duration wait)>;
  // Runs `attempt(context, wait)` until it succeeds or fails for good.
  // Non-blocking calls (`call_deadline` == nullopt): each attempt's deadline
  // is rpc_timeout, UNAVAILABLE is retried with backoff for connect_timeout.
  // Blocking calls: `wait` is the server-side wait of this attempt (at most
  // max_wait_per_rpc, ending by `call_deadline`), the RPC deadline is a
  // little later; UNAVAILABLE and the server's DEADLINE_EXCEEDED are retried
  // until `call_deadline`. Errors name the coordinator and `what`.
  absl::Status Call(absl::string_view what,
                    std::optional<absl::Time> call_deadline,
                    const Attempt& attempt);

  struct PendingRelease {
    std::string job_id;
    std::string round;
    std::string node_id;
    int num_nodes = 0;
  };

  const Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::optional<PendingRelease> release_when_done_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_CLIENT_H_
