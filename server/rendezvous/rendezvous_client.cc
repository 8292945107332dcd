#include "server/rendezvous/rendezvous_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/rendezvous/rendezvous_service.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

// Release runs when a job ends (often from a destructor): never long.
constexpr absl::Duration kReleaseTimeout = absl::Seconds(2);

// gRPC reports a failed TLS handshake as UNAVAILABLE, like a coordinator
// not up yet; its message tells them apart.
bool IsTlsFailure(absl::string_view message) {
  for (absl::string_view marker :
       {"Ssl handshake", "Handshake failed", "Handshake read failed",
        "SSL_ERROR", "Peer name", "peer certificate", "certificate verify"}) {
    if (absl::StrContains(message, marker)) return true;
  }
  return false;
}

}  // namespace

RendezvousClient::RendezvousClient(const Options& options) : options_(options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Reconnect quickly while the coordinator is starting.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      grpc::InsecureChannelCredentials();
  if (options.credentials != nullptr) {
    options.credentials->ConfigureChannel(&args);
    creds = options.credentials->ChannelCredentials();
  }
  channel_ = grpc::CreateCustomChannel(options.address, creds, args);
  stub_ = v1::Rendezvous::NewStub(channel_);
}

RendezvousClient::~RendezvousClient() {
  if (!release_when_done_.has_value()) return;
  const PendingRelease& r = *release_when_done_;
  absl::StatusOr<bool> released =
      Release(r.job_id, r.round, r.node_id, r.num_nodes);
  if (!released.ok()) {
    spdlog::debug("job '{}': telling the coordinator that round '{}' ended: {}",
                  r.job_id, r.round, released.status().ToString());
  } else if (*released) {
    spdlog::debug(
        "job '{}': round '{}' ended on every node; the coordinator "
        "dropped its keys",
        r.job_id, r.round);
  }
}

void RendezvousClient::ReleaseRoundWhenDone(std::string job_id,
                                            std::string round,
                                            std::string node_id,
                                            int num_nodes) {
  release_when_done_ = PendingRelease{std::move(job_id), std::move(round),
                                      std::move(node_id), num_nodes};
}

absl::StatusOr<bool> RendezvousClient::Release(absl::string_view job_id,
                                               absl::string_view round,
                                               absl::string_view node_id,
                                               int num_nodes) {
  v1::RendezvousReleaseRequest request;
  request.set_job_id(std::string(job_id));
  request.set_round(std::string(round));
  request.set_node_id(std::string(node_id));
  request.set_num_nodes(num_nodes);
  v1::RendezvousReleaseResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + std::min(options_.rpc_timeout, kReleaseTimeout)));
  if (options_.credentials != nullptr) {
    options_.credentials->AddToCall(&context);
  }
  const grpc::Status status = stub_->Release(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("rendezvous Release('", round, "') at coordinator ",
                     options_.address, ": ", status.error_message()));
  }
  return response.deleted();
}

absl::StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Create(
    const Options& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("rendezvous: empty coordinator address");
  }
  return std::unique_ptr<RendezvousClient>(new RendezvousClient(options));
}

std::string RendezvousClient::Describe() const {
  return absl::StrCat("coordinator ", options_.address);
}

absl::Status RendezvousClient::Call(absl::string_view what,
                                    std::optional<absl::Time> call_deadline,
                                    const Attempt& attempt) {
  const bool blocking = call_deadline.has_value();
  const absl::Time start = absl::Now();
  // A blocking call's own timeout bounds everything, retries included.
  const absl::Time retry_deadline =
      blocking ? *call_deadline : start + options_.connect_timeout;
  absl::Duration backoff = options_.initial_backoff;
  int attempts = 0;
  while (true) {
    ++attempts;
    const absl::Time now = absl::Now();
    absl::Duration wait = absl::ZeroDuration();
    absl::Time rpc_deadline = now + options_.rpc_timeout;
    if (blocking) {
      wait = std::clamp(*call_deadline - now, absl::Milliseconds(1),
                        options_.max_wait_per_rpc);
      rpc_deadline = now + wait + options_.response_grace;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(rpc_deadline));
    if (options_.credentials != nullptr) {
      options_.credentials->AddToCall(&context);
    }
    const grpc::Status status = attempt(&context, wait);
    if (status.ok()) return absl::OkStatus();
    const grpc::StatusCode code = status.error_code();
    const absl::Time after = absl::Now();
    if (code == grpc::StatusCode::UNAVAILABLE &&
        IsTlsFailure(status.error_message())) {
      // Certificates do not fix themselves while we retry.
      return absl::UnauthenticatedError(absl::StrCat(
          "rendezvous ", what, " at coordinator ", options_.address,
          ": the TLS handshake failed: ", status.error_message(),
          " (check rendezvous.tls on both daemons: each certificate signed "
          "by the other's ca_file, the coordinator's naming the host dialled "
          "or rendezvous.tls.server_name)"));
    }
    if (code == grpc::StatusCode::UNAVAILABLE && after < retry_deadline) {
      absl::SleepFor(std::min(backoff, retry_deadline - after));
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED && blocking &&
        after < *call_deadline) {
      continue;  // The server capped its wait; wait again.
    }
    std::string detail = status.error_message();
    if (code == grpc::StatusCode::UNAVAILABLE) {
      detail = absl::StrCat("coordinator unreachable for ",
                            absl::FormatDuration(after - start), " (", attempts,
                            " attempts): ", detail);
      if (absl::StrContains(detail, "Socket closed")) {
        absl::StrAppend(&detail,
                        " (a coordinator that requires mutual TLS closes "
                        "plaintext connections: check that every daemon "
                        "sets rendezvous.tls)");
      }
    }
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("rendezvous ", what, " at coordinator ",
                                     options_.address, ": ", detail));
  }
}

absl::Status RendezvousClient::Set(absl::string_view job_id,
                                   absl::string_view key,
                                   absl::string_view value) {
  v1::RendezvousSetRequest request;
  request.set_job_id(std::string(job_id));
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  return Call(absl::StrCat("Set('", key, "')"), std::nullopt,
              [&](grpc::ClientContext* context, absl::Duration) {
                v1::RendezvousSetResponse response;
                return stub_->Set(context, request, &response);
              });
}

absl::StatusOr<std::string> RendezvousClient::Get(absl::string_view job_id,
                                                  absl::string_view key,
                                                  absl::Duration timeout) {
  v1::RendezvousGetRequest request;
  request.set_job_id(std::string(job_id));
  request.set_key(std::string(key));
  v1::RendezvousGetResponse response;
  absl::Status status =
      Call(absl::StrCat("Get('", key, "')"), absl::Now() + timeout,
           [&](grpc::ClientContext* context, absl::Duration wait) {
             request.set_wait_timeout_ms(
                 std::max<int64_t>(1, absl::ToInt64Milliseconds(wait)));
             return stub_->Get(context, request, &response);
           });
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> RendezvousClient::Add(absl::string_view job_id,
                                              absl::string_view key,
                                              int64_t delta) {
  v1::RendezvousAddRequest request;
  request.set_job_id(std::string(job_id));
  request.set_key(std::string(key));
  request.set_delta(delta);
  v1::RendezvousAddResponse response;
  absl::Status status = Call(absl::StrCat("Add('", key, "')"), std::nullopt,
                             [&](grpc::ClientContext* context, absl::Duration) {
                               return stub_->Add(context, request, &response);
                             });
  if (!status.ok()) return status;
  return response.value();
}

absl::Status RendezvousClient::Wait(absl::string_view job_id,
                                    absl::Span<const std::string> keys,
                                    absl::Duration timeout) {
  v1::RendezvousWaitRequest request;
  request.set_job_id(std::string(job_id));
  for (const std::string& key : keys) request.add_keys(key);
  return Call(absl::StrCat("Wait(", keys.size(), " keys)"),
              absl::Now() + timeout,
              [&](grpc::ClientContext* context, absl::Duration wait) {
                request.set_wait_timeout_ms(
                    std::max<int64_t>(1, absl::ToInt64Milliseconds(wait)));
                v1::RendezvousWaitResponse response;
                return stub_->Wait(context, request, &response);
              });
}

absl::StatusOr<bool> RendezvousClient::Delete(absl::string_view job_id,
                                              absl::string_view key) {
  v1::RendezvousDeleteRequest request;
  request.set_job_id(std::string(job_id));
  request.set_key(std::string(key));
  v1::RendezvousDeleteResponse response;
  absl::Status status =
      Call(absl::StrCat("Delete('", key, "')"), std::nullopt,
           [&](grpc::ClientContext* context, absl::Duration) {
             return stub_->Delete(context, request, &response);
           });
  if (!status.ok()) return status;
  return response.deleted();
}

}  // namespace gradd
