#include "server/rendezvous/etcd/etcd_client.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace gradd {
namespace {

// etcd's default --max-txn-ops is 128; the existence checks of a wait are
// read in transactions of at most this many ranges.
constexpr size_t kMaxRangesPerTxn = 64;

absl::Duration Min(absl::Duration a, absl::Duration b) { return a < b ? a : b; }

// etcd answers with these when a token must be fetched again.
bool NeedsNewToken(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) return true;
  const std::string& m = status.error_message();
  return absl::StrContains(m, "invalid auth token") ||
         absl::StrContains(m, "revision of auth store is old");
}

// Failures that another endpoint (or the same one a little later) may not
// have: the member is down, has no leader, or did not answer in time.
bool IsRetriable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

std::string EtcdPrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(
    Options options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoint configured");
  }
  for (std::string& e : options.endpoints) {
    absl::string_view v = absl::StripAsciiWhitespace(e);
    // Accept etcd's own spelling of client URLs.
    if (!absl::ConsumePrefix(&v, "https://"))
      absl::ConsumePrefix(&v, "http://");
    absl::ConsumeSuffix(&v, "/");
    const size_t colon = v.rfind(':');
    int port = 0;
    if (v.empty() || colon == absl::string_view::npos ||
        !absl::SimpleAtoi(v.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", e, "': expected host:port (e.g. 10.0.0.1:2379)"));
    }
    e = std::string(v);
  }
  if (options.tls.cert_pem.empty() != options.tls.key_pem.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate needs its private key and the reverse");
  }
  if (!options.tls.cert_pem.empty() && options.tls.ca_pem.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate needs the CA that signed etcd's "
        "certificate");
  }
  if (options.user.empty() != options.password.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a user needs a password and the reverse");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

EtcdClient::EtcdClient(Options options) : options_(std::move(options)) {
  credentials_ = grpc::InsecureChannelCredentials();
  if (!options_.tls.ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls.ca_pem;
    ssl.pem_private_key = options_.tls.key_pem;
    ssl.pem_cert_chain = options_.tls.cert_pem;
    credentials_ = grpc::SslCredentials(ssl);
  }
  absl::MutexLock lock(&mu_);
  for (const std::string& address : options_.endpoints) {
    endpoints_.push_back(MakeEndpoint(address));
  }
}

std::shared_ptr<EtcdClient::Endpoint> EtcdClient::MakeEndpoint(
    const std::string& address) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // One channel per endpoint: never let gRPC share a subchannel between
  // two of them (failover must reach a different member).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!options_.tls.server_name.empty()) {
    args.SetSslTargetNameOverride(options_.tls.server_name);
  }
  auto e = std::make_shared<Endpoint>();
  e->address = address;
  e->channel = grpc::CreateCustomChannel(address, credentials_, args);
  e->kv = etcdserverpb::KV::NewStub(e->channel);
  e->lease = etcdserverpb::Lease::NewStub(e->channel);
  e->watch = etcdserverpb::Watch::NewStub(e->channel);
  e->auth = etcdserverpb::Auth::NewStub(e->channel);
  return e;
}

EtcdClient::~EtcdClient() { CancelStreams(); }

std::string EtcdClient::Describe() const {
  return absl::StrCat("etcd ", absl::StrJoin(options_.endpoints, ","));
}

std::string EtcdClient::SecurityDescription() const {
  std::string s = options_.tls.ca_pem.empty()     ? "plaintext"
                  : options_.tls.cert_pem.empty() ? "TLS"
                                                  : "mTLS";
  if (!options_.user.empty()) absl::StrAppend(&s, " + user ", options_.user);
  return s;
}

void EtcdClient::CancelStreams() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : stream_contexts_) c->TryCancel();
}

std::pair<std::shared_ptr<EtcdClient::Endpoint>, int> EtcdClient::Pick() const {
  absl::MutexLock lock(&mu_);
  return {endpoints_[current_], current_};
}

void EtcdClient::Advance(int failed, const std::shared_ptr<Endpoint>& seen) {
  std::shared_ptr<Endpoint> fresh = MakeEndpoint(seen->address);
  absl::MutexLock lock(&mu_);
  // Only the first caller to see this endpoint fail moves everyone on.
  if (endpoints_[failed] == seen) {
    endpoints_[failed] = std::move(fresh);
    if (current_ == failed) {
      current_ = (current_ + 1) % static_cast<int>(endpoints_.size());
    }
  }
}

absl::Status EtcdClient::FromGrpc(absl::string_view what,
                                  const grpc::Status& status,
                                  absl::string_view endpoint) const {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(Describe(), ": ", what, " (at ", endpoint,
                                   "): ", status.error_message()));
}

absl::Status EtcdClient::Authenticate(Endpoint& endpoint, absl::Time deadline) {
  etcdserverpb::AuthenticateRequest request;
  request.set_name(options_.user);
  request.set_password(options_.password);
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      std::min(deadline, absl::Now() + options_.rpc_timeout)));
  grpc::Status s = endpoint.auth->Authenticate(&context, request, &response);
  ObserveCall("Authenticate",
              absl::Status(static_cast<absl::StatusCode>(s.error_code()), ""));
  if (!s.ok()) {
    // etcd says "authentication failed, invalid user ID or password" with
    // INVALID_ARGUMENT; the caller needs to fix credentials, not retry.
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      s = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, s.error_message());
    }
    return FromGrpc(absl::StrCat("authenticating as user '", options_.user,
                                 "' (rendezvous.etcd.user)"),
                    s, endpoint.address);
  }
  absl::MutexLock lock(&mu_);
  token_ = response.token();
  return absl::OkStatus();
}

absl::Status EtcdClient::PrepareContext(Endpoint& endpoint,
                                        grpc::ClientContext* context,
                                        absl::Time deadline) {
  if (options_.user.empty()) return absl::OkStatus();
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  if (token.empty()) {
    RETURN_IF_ERROR(Authenticate(endpoint, deadline));
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  context->AddMetadata("token", token);
  return absl::OkStatus();
}

void EtcdClient::ObserveCall(absl::string_view method,
                             const absl::Status& status) const {
  if (options_.on_call) options_.on_call(method, status.code());
}

void EtcdClient::ObserveEndpointFailure(absl::string_view endpoint) const {
  if (options_.on_endpoint_failure) options_.on_endpoint_failure(endpoint);
}

absl::Status EtcdClient::Call(absl::string_view what, const Attempt& attempt,
                              absl::Time deadline, absl::string_view method) {
  absl::Status status = CallWithRetries(what, attempt, deadline);
  ObserveCall(method.empty() ? what : method, status);
  return status;
}

absl::Status EtcdClient::CallWithRetries(absl::string_view what,
                                         const Attempt& attempt,
                                         absl::Time deadline) {
  const absl::Time start = absl::Now();
  const absl::Time until = std::min(deadline, start + options_.retry_timeout);
  absl::Duration backoff = options_.initial_backoff;
  bool reauthenticated = false;
  std::string last_error;
  while (true) {
    auto [picked, index] = Pick();
    Endpoint& endpoint = *picked;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        std::min(until, absl::Now() + options_.rpc_timeout)));
    grpc::Status status;
    if (absl::Status prepared = PrepareContext(endpoint, &context, until);
        !prepared.ok()) {
      if (!absl::IsUnavailable(prepared) &&
          !absl::IsDeadlineExceeded(prepared)) {
        return prepared;
      }
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            std::string(prepared.message()));
    } else {
      status = attempt(endpoint, &context);
    }
    if (status.ok()) return absl::OkStatus();
    if (!options_.user.empty() && NeedsNewToken(status) && !reauthenticated) {
      reauthenticated = true;
      absl::MutexLock lock(&mu_);
      token_.clear();
      continue;
    }
    if (!IsRetriable(status)) return FromGrpc(what, status, endpoint.address);
    last_error = absl::StrCat(endpoint.address, ": ", status.error_message());
    ObserveEndpointFailure(endpoint.address);
    Advance(index, picked);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        return absl::UnavailableError(
            absl::StrCat(Describe(), ": ", what, ": client shut down"));
      }
    }
    const absl::Time now = absl::Now();
    if (now + backoff >= until) {
      if (until == deadline && deadline < start + options_.retry_timeout) {
        return absl::DeadlineExceededError(
            absl::StrCat(Describe(), ": ", what,
                         ": no answer before the "
                         "deadline (last: ",
                         last_error, ")"));
      }
      return absl::UnavailableError(absl::StrCat(
          Describe(), ": ", what, ": no endpoint answered within ",
          absl::FormatDuration(now - start), " (last: ", last_error, ")"));
    }
    absl::SleepFor(backoff);
    backoff = Min(backoff * 2, options_.max_backoff);
  }
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request, absl::Time deadline) {
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(Call(
      "Range",
      [&](Endpoint& e, grpc::ClientContext* c) {
        return e.kv->Range(c, request, &response);
      },
      deadline));
  return response;
}

absl::StatusOr<etcdserverpb::PutResponse> EtcdClient::Put(
    const etcdserverpb::PutRequest& request, absl::Time deadline) {
  etcdserverpb::PutResponse response;
  RETURN_IF_ERROR(Call(
      "Put",
      [&](Endpoint& e, grpc::ClientContext* c) {
        return e.kv->Put(c, request, &response);
      },
      deadline));
  return response;
}

absl::StatusOr<etcdserverpb::DeleteRangeResponse> EtcdClient::DeleteRange(
    const etcdserverpb::DeleteRangeRequest& request, absl::Time deadline) {
  etcdserverpb::DeleteRangeResponse response;
  RETURN_IF_ERROR(Call(
      "DeleteRange",
      [&](Endpoint& e, grpc::ClientContext* c) {
        return e.kv->DeleteRange(c, request, &response);
      },
      deadline));
  return response;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& request, absl::Time deadline) {
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(Call(
      "Txn",
      [&](Endpoint& e, grpc::ClientContext* c) {
        return e.kv->Txn(c, request, &response);
      },
      deadline));
  return response;
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(
    absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(
      1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  RETURN_IF_ERROR(Call("LeaseGrant", [&](Endpoint& e, grpc::ClientContext* c) {
    return e.lease->LeaseGrant(c, request, &response);
  }));
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat(Describe(), ": LeaseGrant: ", response.error()));
  }
  return response;
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease_id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse response;
  return Call("LeaseRevoke", [&](Endpoint& e, grpc::ClientContext* c) {
    return e.lease->LeaseRevoke(c, request, &response);
  });
}

absl::StatusOr<int64_t> EtcdClient::LeaseTimeToLive(int64_t lease_id) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseTimeToLiveResponse response;
  RETURN_IF_ERROR(
      Call("LeaseTimeToLive", [&](Endpoint& e, grpc::ClientContext* c) {
        return e.lease->LeaseTimeToLive(c, request, &response);
      }));
  return response.ttl();
}

absl::StatusOr<int64_t> EtcdClient::KeepAliveOnce(int64_t lease_id) {
  // One short stream per keep-alive: a stream that hangs cannot outlive
  // rpc_timeout, and failover is Call's.
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseKeepAliveResponse response;
  RETURN_IF_ERROR(
      Call("LeaseKeepAlive", [&](Endpoint& e, grpc::ClientContext* c) {
        auto stream = e.lease->LeaseKeepAlive(c);
        if (stream->Write(request) && stream->Read(&response)) {
          // A clean close: etcd ends the stream when the client half-closes
          // it. (A cancel, which ended it before, is counted by etcd as a
          // failed call, so etcd's error alerts fired on every keep-alive.)
          stream->WritesDone();
          stream->Finish().IgnoreError();
          return grpc::Status::OK;
        }
        stream->WritesDone();
        grpc::Status s = stream->Finish();
        return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     "keep-alive stream ended without answer")
                      : s;
      }));
  return response.ttl();
}

absl::Status EtcdClient::WatchOnce(Endpoint& endpoint,
                                   absl::Span<const std::string> missing,
                                   int64_t start_revision, absl::Time until,
                                   std::vector<std::string>* appeared) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(until));
  RETURN_IF_ERROR(PrepareContext(endpoint, &context, until));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      return absl::UnavailableError(
          absl::StrCat(Describe(), ": client shut down"));
    }
    stream_contexts_.push_back(&context);
  }
  auto stream = endpoint.watch->Watch(&context);
  absl::flat_hash_set<std::string> remaining(missing.begin(), missing.end());
  bool written = true;
  for (const std::string& key : missing) {
    etcdserverpb::WatchRequest request;
    request.mutable_create_request()->set_key(key);
    request.mutable_create_request()->set_start_revision(start_revision);
    if (!stream->Write(request)) {
      written = false;
      break;
    }
  }
  etcdserverpb::WatchResponse response;
  while (written && !remaining.empty() && stream->Read(&response)) {
    if (response.canceled() || response.compact_revision() > 0) break;
    for (const mvccpb::Event& event : response.events()) {
      if (event.type() == mvccpb::Event::PUT) {
        if (remaining.erase(event.kv().key()) > 0) {
          appeared->push_back(event.kv().key());
        }
      }
    }
  }
  context.TryCancel();
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    stream_contexts_.erase(
        std::find(stream_contexts_.begin(), stream_contexts_.end(), &context));
    if (cancelled_) {
      return absl::UnavailableError(
          absl::StrCat(Describe(), ": client shut down"));
    }
  }
  // Ended by us (all keys seen, etcd cancelled, deadline): the caller reads
  // the keys again. A failure before the first answer is the endpoint's.
  const bool failed =
      !status.ok() && status.error_code() != grpc::StatusCode::CANCELLED &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
  ObserveCall(
      "Watch",
      failed
          ? absl::Status(static_cast<absl::StatusCode>(status.error_code()), "")
          : absl::OkStatus());
  if (failed) {
    if (!options_.user.empty() && NeedsNewToken(status)) {
      absl::MutexLock lock(&mu_);
      token_.clear();
    }
    return FromGrpc("Watch", status, endpoint.address);
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::WaitForKeys(
    absl::Span<const std::string> keys, absl::Time deadline,
    const std::function<std::string(absl::string_view)>& describe_key) {
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    // Which keys exist, read at one revision per transaction.
    std::vector<std::string> missing;
    int64_t revision = 0;
    for (size_t begin = 0; begin < keys.size(); begin += kMaxRangesPerTxn) {
      const size_t end = std::min(keys.size(), begin + kMaxRangesPerTxn);
      etcdserverpb::TxnRequest txn;
      for (size_t i = begin; i < end; ++i) {
        etcdserverpb::RangeRequest* r =
            txn.add_success()->mutable_request_range();
        r->set_key(keys[i]);
        r->set_count_only(true);
      }
      etcdserverpb::TxnResponse response;
      RETURN_IF_ERROR(Call(
          "Range",
          [&](Endpoint& e, grpc::ClientContext* c) {
            return e.kv->Txn(c, txn, &response);
          },
          // The last look, when the wait's deadline has just passed, still
          // gets one attempt's time.
          std::max(deadline, absl::Now() + options_.rpc_timeout), "Txn"));
      if (begin == 0) revision = response.header().revision();
      for (size_t i = begin; i < end; ++i) {
        const etcdserverpb::ResponseOp& op = response.responses(i - begin);
        if (op.response_range().count() == 0) missing.push_back(keys[i]);
      }
    }
    if (missing.empty()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      std::vector<std::string> shown;
      for (const std::string& k : missing) {
        shown.push_back(describe_key ? describe_key(k) : k);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          Describe(),
          ": still missing after the wait: ", absl::StrJoin(shown, ", ")));
    }
    auto [picked, index] = Pick();
    std::vector<std::string> appeared;
    absl::Status watched = WatchOnce(
        *picked, missing, revision + 1,
        std::min(deadline, now + options_.max_watch_per_stream), &appeared);
    if (!watched.ok()) {
      if (absl::IsUnavailable(watched) &&
          absl::StrContains(watched.message(), "client shut down")) {
        return watched;
      }
      if (absl::IsUnauthenticated(watched) ||
          absl::IsPermissionDenied(watched)) {
        return watched;
      }
      // The member went away: read again, on the next endpoint.
      ObserveEndpointFailure(picked->address);
      Advance(index, picked);
      absl::SleepFor(std::min(backoff, deadline - absl::Now()));
      backoff = Min(backoff * 2, options_.max_backoff);
    }
  }
}

}  // namespace gradd
