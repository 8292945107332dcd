// EtcdClient: the part of etcd's v3 gRPC API gradd uses (KV, Lease, Watch,
// Auth.Authenticate; proto/etcd/), spoken over the project's own gRPC to a
// list of endpoints.
//
// Endpoints and failover: one channel per endpoint ("host:port"). A call
// goes to the endpoint that answered last; when it fails with UNAVAILABLE
// (member down, no leader, connection refused) the next endpoint is tried,
// round the list with backoff, until Options::retry_timeout has passed
// since the call began (or the call's own deadline). Then the error is
// UNAVAILABLE naming every endpoint. Like any etcd client, a Put or Txn
// whose answer was lost may have been applied once before its retry; the
// callers' operations are written so that a repeat is harmless (EtcdStore's
// Add compares the value it read).
//
// Security: TLS when Options::tls.ca_pem is set (server certificate checked
// against it; the client certificate and key, when given, are shown to
// etcd: mutual TLS, etcd's --client-cert-auth). With Options::user, the
// client authenticates (Auth.Authenticate) on first use and sends the token
// in the `token` metadata of every call, authenticating again when etcd
// says the token is invalid or expired. Passwords, keys and tokens never
// appear in an error message or a log line.
//
// Waiting for keys: a Watch stream on the missing keys, started at the
// revision just after a Range that saw them missing, so no write in between
// is lost. One stream lasts at most Options::max_watch_per_stream; then
// (or when etcd cancels the watch, e.g. after a compaction, or the member
// goes away) the keys are read again and a new stream starts, on the next
// endpoint if needed. So a wait is bounded by its deadline and survives a
// member's death.
//
// Observability: Options::on_call hears the method and outcome of every
// call once it is over (after its retries; the gradd_etcd_requests_total
// metric), Options::on_endpoint_failure every attempt that failed on an
// endpoint as unavailable before the call moved on
// (gradd_etcd_endpoint_failures_total).
//
// Errors: UNAVAILABLE (no endpoint answered in time), DEADLINE_EXCEEDED (a
// wait's deadline passed), UNAUTHENTICATED / PERMISSION_DENIED (etcd refused
// the credentials or the key), INVALID_ARGUMENT (bad options), others as etcd
// answers them; every message starts with Describe().
//
// Thread-safety: every method may be called from any thread concurrently.
#ifndef GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_CLIENT_H_
#define GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "etcd/api/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace gradd {

class EtcdClient {
 public:
  struct TlsOptions {
    // PEM text (not file names). Empty ca_pem: plaintext.
    std::string ca_pem;
    std::string cert_pem;
    std::string key_pem;
    // Name checked in the server's certificate; empty: the endpoint's host.
    std::string server_name;
  };
  struct Options {
    // "host:port" of etcd members (clients URLs without the scheme).
    std::vector<std::string> endpoints;
    TlsOptions tls;
    // etcd user and password (empty user: no Authenticate).
    std::string user;
    std::string password;
    // Deadline of one unary call attempt.
    absl::Duration rpc_timeout = absl::Seconds(5);
    // How long a call goes on trying endpoints that are unavailable.
    absl::Duration retry_timeout = absl::Seconds(15);
    // Longest single Watch stream of a wait (see the header comment).
    absl::Duration max_watch_per_stream = absl::Seconds(10);
    absl::Duration initial_backoff = absl::Milliseconds(20);
    absl::Duration max_backoff = absl::Milliseconds(500);
    // Largest message, both directions.
    int max_message_bytes = 8 << 20;
    // Told of every call once it is over: its etcd method (one of
    // kMethods) and outcome. Called on the calling thread, without a lock
    // of the client held; must not block. May be null.
    std::function<void(absl::string_view method, absl::StatusCode code)>
        on_call;
    // Told of every attempt that failed on `endpoint` (one of `endpoints`)
    // as unavailable or timed out, after which the call tries the next
    // endpoint. Same rules as on_call.
    std::function<void(absl::string_view endpoint)> on_endpoint_failure;
  };

  // The etcd methods on_call names: KV's Range, Put, DeleteRange, Txn;
  // Lease's LeaseGrant, LeaseRevoke, LeaseTimeToLive, LeaseKeepAlive (one
  // exchange); Watch (one stream); Auth's Authenticate.
  static constexpr const char* kMethods[] = {
      "Range",      "Put",         "DeleteRange",     "Txn",
      "LeaseGrant", "LeaseRevoke", "LeaseTimeToLive", "LeaseKeepAlive",
      "Watch",      "Authenticate"};

  // INVALID_ARGUMENT for no endpoint, an endpoint without a port, or a
  // client certificate without its key (and the reverse). Connects lazily.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(Options options);
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;
  ~EtcdClient();

  // The KV calls. `deadline` bounds the whole call, failover included
  // (DEADLINE_EXCEEDED naming the endpoints when it passes first);
  // otherwise retry_timeout does (UNAVAILABLE).
  [[nodiscard]] absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& request,
      absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::StatusOr<etcdserverpb::PutResponse> Put(
      const etcdserverpb::PutRequest& request,
      absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::StatusOr<etcdserverpb::DeleteRangeResponse> DeleteRange(
      const etcdserverpb::DeleteRangeRequest& request,
      absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request,
      absl::Time deadline = absl::InfiniteFuture());

  // A lease of `ttl` (rounded up to whole seconds, at least 1 s).
  [[nodiscard]] absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(
      absl::Duration ttl);
  // NOT_FOUND when the lease is already gone.
  [[nodiscard]] absl::Status LeaseRevoke(int64_t lease_id);
  // Seconds left of the lease; -1 when it expired or never existed.
  [[nodiscard]] absl::StatusOr<int64_t> LeaseTimeToLive(int64_t lease_id);
  // One keep-alive exchange on a LeaseKeepAlive stream: the lease's new TTL
  // in seconds, <= 0 when the lease is gone. Each exchange opens a short
  // stream (bounded by rpc_timeout, failing over like a unary call), so a
  // hung stream can never outlive the lease (EtcdLease calls this from its
  // keeper thread every ttl/3).
  [[nodiscard]] absl::StatusOr<int64_t> KeepAliveOnce(int64_t lease_id);

  // Waits until every key of `keys` exists, or `deadline`
  // (DEADLINE_EXCEEDED naming the keys still missing, as `describe_key`
  // prints them). Returns at once when all exist.
  [[nodiscard]] absl::Status WaitForKeys(
      absl::Span<const std::string> keys, absl::Time deadline,
      const std::function<std::string(absl::string_view)>& describe_key =
          nullptr);

  // "etcd 10.0.0.1:2379,10.0.0.2:2379" (never a credential).
  std::string Describe() const;
  // "mTLS" / "TLS" / "plaintext", plus " + user <name>" (for logs).
  std::string SecurityDescription() const;
  const std::vector<std::string>& endpoints() const {
    return options_.endpoints;
  }

  // Stops a KeepAliveOnce or WaitForKeys blocked on a stream (shutdown).
  void CancelStreams();

 private:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };

  explicit EtcdClient(Options options);
  std::shared_ptr<Endpoint> MakeEndpoint(const std::string& address) const;
  // The endpoint calls go to now, and its index.
  std::pair<std::shared_ptr<Endpoint>, int> Pick() const;

  using Attempt =
      std::function<grpc::Status(Endpoint& endpoint, grpc::ClientContext*)>;
  // Runs `attempt` against the current endpoint, failing over and
  // re-authenticating as the header comment says, until it succeeds, fails
  // for good, or `deadline` (default: now + retry_timeout). `what` names
  // the call in errors; `method` (default: `what`) is the etcd method the
  // attempt calls, for on_call.
  absl::Status Call(absl::string_view what, const Attempt& attempt,
                    absl::Time deadline = absl::InfiniteFuture(),
                    absl::string_view method = {});
  absl::Status CallWithRetries(absl::string_view what, const Attempt& attempt,
                               absl::Time deadline);
  // Tells Options::on_call / on_endpoint_failure, when set.
  void ObserveCall(absl::string_view method, const absl::Status& status) const;
  void ObserveEndpointFailure(absl::string_view endpoint) const;
  // Adds the auth token (authenticating first when there is none).
  absl::Status PrepareContext(Endpoint& endpoint, grpc::ClientContext* context,
                              absl::Time deadline);
  absl::Status Authenticate(Endpoint& endpoint, absl::Time deadline);
  absl::Status FromGrpc(absl::string_view what, const grpc::Status& status,
                        absl::string_view endpoint) const;
  // Moves calls on from endpoint `failed` (unless another caller did) and
  // gives it a fresh channel: a gRPC channel whose connection attempts
  // failed while a member was starting can stay unable to connect to it.
  void Advance(int failed, const std::shared_ptr<Endpoint>& seen);
  // One Watch stream until every key exists (OK), the stream ends (OK too;
  // the caller re-reads), or `until`.
  absl::Status WatchOnce(Endpoint& endpoint,
                         absl::Span<const std::string> missing,
                         int64_t start_revision, absl::Time until,
                         std::vector<std::string>* appeared);

  const Options options_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
  int current_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> stream_contexts_ ABSL_GUARDED_BY(mu_);
};

// The end of the range of every key starting with `prefix` (etcd's
// "prefix + 1": the last byte below 0xff incremented, the rest dropped;
// "\0" when there is none, i.e. every key from `prefix` on).
std::string EtcdPrefixEnd(absl::string_view prefix);

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_CLIENT_H_
