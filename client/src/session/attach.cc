// Client::Attach: the attach handshake with the node's daemon, which makes
// the ClientImpl (data/client_impl.h) that serves the trainer from then on:
//
//   connect <socket>.session (retry until connect_timeout)
//     -> who serves it? (daemon_peer.h)   -> SessionHello (session id) or
//        SessionRefused
//   probe unix:<socket>: the same daemon process?
//     -> Node.Attach RPC (blocks until every local rank attached)
//     -> SessionFds + [control block, rank memory, rank control, bell
//        (, device memory)]
//     -> ClientImpl::Init validates and maps them
//
// With find_unused_parameters the attach registers the used map's hidden
// parameter first and returns the UsedMapClient decorator over the
// ClientImpl (data/used_map_client.h). The launcher's environment fills in
// what ClientOptions leaves unset (launcher_env.h) and is checked against the
// job the daemons formed. Runs on the caller's thread; blocks for at most
// connect_timeout + attach_timeout.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/src/data/client_impl.h"
#include "client/src/data/comm_hook_options.h"
#include "client/src/data/used_map_client.h"
#include "client/src/device/device_client.h"
#include "client/src/session/daemon_peer.h"
#include "client/src/session/launcher_env.h"
#include "common/client_strings.h"
#include "common/control_block.h"
#include "common/grpc_status.h"
#include "common/session.h"
#include "common/shm.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "gradd/client.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace gradd {
namespace internal {
namespace {

// The daemon sends the fds before the Attach RPC returns, so they are
// already queued; this only guards against a broken daemon.
constexpr std::chrono::milliseconds kFdsTimeout{5000};
constexpr std::chrono::milliseconds kConnectRetry{20};

std::chrono::milliseconds Left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

// Connects to the daemon's session socket, retrying while nobody listens
// (the daemon may still be starting) until `timeout` has passed.
absl::StatusOr<UniqueFd> ConnectSession(const std::string& socket_path,
                                        std::chrono::milliseconds timeout) {
  const std::string session_path = SessionSocketPath(socket_path);
  const std::optional<sockaddr_un> addr = UnixAddress(session_path);
  if (!addr.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradd socket path '", socket_path, "' is too long for a Unix socket (",
        sizeof(sockaddr_un::sun_path) - 1 -
            (session_path.size() - socket_path.size()),
        " bytes at most)"));
  }

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = After<Clock>(timeout);
  int last_errno = 0;
  while (true) {
    absl::StatusOr<UniqueFd> fd = UnixSocket(SOCK_SEQPACKET);
    if (!fd.ok()) return fd.status();
    last_errno = ConnectUnix(fd->get(), *addr);
    if (last_errno == 0) return fd;
    // Nothing there yet (ENOENT), a stale socket file or a daemon still
    // starting (ECONNREFUSED), a full backlog (EAGAIN): worth retrying.
    // Anything else (EACCES, ENOTDIR, ...) will not fix itself.
    const bool retryable = last_errno == ENOENT || last_errno == ECONNREFUSED ||
                           last_errno == EAGAIN;
    if (!retryable || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min(kConnectRetry, Left(deadline)));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::now() - start);
  std::string what = absl::StrCat(
      "no gradd daemon at ", socket_path, ": connecting to ", session_path,
      " failed (", std::strerror(last_errno), ") for ", waited.count(),
      " ms; start gradd with --socket ", socket_path,
      " or point GRADD_SOCKET at the daemon's socket");
  if (last_errno == EACCES || last_errno == EPERM) {
    return absl::PermissionDeniedError(what);
  }
  return absl::UnavailableError(what);
}

// The strings an attach sends (common/client_strings.h). The daemon
// refuses bad ones too; refusing here names the field before anything is
// sent.
absl::Status CheckAttachStrings(const ClientOptions& options,
                                const std::vector<ClientParam>& params) {
  RETURN_IF_ERROR(CheckClientString("job_id", options.job_id, kMaxJobIdBytes));
  RETURN_IF_ERROR(
      CheckClientString("node_id", options.node_id, kMaxNodeIdBytes));
  RETURN_IF_ERROR(CheckClientString("coordinator", options.coordinator,
                                    kMaxCoordinatorBytes));
  RETURN_IF_ERROR(CheckClientString("comm_hook.name", options.comm_hook.name,
                                    kMaxCommHookNameBytes));
  for (size_t i = 0; i < params.size(); ++i) {
    RETURN_IF_ERROR(CheckClientString(absl::StrCat("params[", i, "].name"),
                                      params[i].name, kMaxParamNameBytes));
  }
  return absl::OkStatus();
}

// The size of the rank's shared area for broadcasts and collectives. A job
// that may see rank restarts needs one for the state sync
// (Client::BeginStateSync): the default when nothing was asked for. Every
// local rank asks for the same grace, so they all get the same area.
size_t CollectiveAreaBytes(const ClientOptions& options, size_t num_params) {
  size_t collective = options.collective_bytes;
  const bool restart = options.rank_restart_grace_ms.value_or(0) > 0 ||
                       options.min_nodes.value_or(0) > 0;
  if (collective == 0 &&
      (num_params == 0 || (restart && options.broadcast_bytes == 0))) {
    collective = kDefaultCollectiveBytes;
  }
  return std::max(options.broadcast_bytes, collective);
}

// ClientOptions::rank_restart_grace_ms unset: $GRADD_RANK_RESTART_GRACE_MS
// when set (else the daemon's rank_restart_grace_ms applies).
absl::Status ApplyRestartGraceEnv(ClientOptions* options) {
  if (options->rank_restart_grace_ms.has_value()) return absl::OkStatus();
  const char* env = std::getenv("GRADD_RANK_RESTART_GRACE_MS");
  if (env == nullptr || *env == '\0') return absl::OkStatus();
  uint32_t ms = 0;
  if (!absl::SimpleAtoi(env, &ms)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GRADD_RANK_RESTART_GRACE_MS='", env,
                     "' is not a number of milliseconds (0 to 4294967295)"));
  }
  options->rank_restart_grace_ms = ms;
  return absl::OkStatus();
}

// ClientOptions::min_nodes unset: $GRADD_MIN_NODES when set (else the
// daemon's min_nodes applies).
absl::Status ApplyMinNodesEnv(ClientOptions* options) {
  if (options->min_nodes.has_value()) return absl::OkStatus();
  const char* env = std::getenv("GRADD_MIN_NODES");
  if (env == nullptr || *env == '\0') return absl::OkStatus();
  uint32_t n = 0;
  if (!absl::SimpleAtoi(env, &n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GRADD_MIN_NODES='", env, "' is not a number of nodes (0 or more)"));
  }
  options->min_nodes = n;
  return absl::OkStatus();
}

// The attach without any decoration: connects, registers exactly `params`
// and maps the shared memory. Client::Attach adds what ClientOptions asks
// for on top of it (the used map of find_unused_parameters).
absl::StatusOr<std::unique_ptr<Client>> AttachDirect(
    const ClientOptions& given, const std::vector<ClientParam>& params) {
  ClientOptions options = given;
  RETURN_IF_ERROR(ApplyLauncherEnv(&options, ProcessEnv));
  if (const char* env = std::getenv("GRADD_HEARTBEAT_TIMEOUT_MS");
      env != nullptr && *env != '\0') {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(env, &ms) || ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GRADD_HEARTBEAT_TIMEOUT_MS='", env,
                       "' is not a positive number of milliseconds"));
    }
    options.heartbeat_timeout = std::chrono::milliseconds(ms);
  }
  RETURN_IF_ERROR(ApplyRestartGraceEnv(&options));
  RETURN_IF_ERROR(ApplyMinNodesEnv(&options));
  RETURN_IF_ERROR(CheckAttachStrings(options, params));
  const std::string socket_path =
      options.socket_path.empty() ? ClientSocketPath() : options.socket_path;
  if (options.local_world_size < 1 || options.local_rank < 0) {
    // The daemon checks ranks too; these would not even index the layout.
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", options.local_rank, " of local world size ",
        options.local_world_size, " is invalid (job '", options.job_id, "')"));
  }
  const Clock::time_point connect_deadline =
      After<Clock>(options.connect_timeout);

  ASSIGN_OR_RETURN(std::optional<uid_t> trusted_uid,
                   TrustedDaemonUid(options.daemon_uid));
  ASSIGN_OR_RETURN(UniqueFd session,
                   ConnectSession(socket_path, options.connect_timeout));
  ASSIGN_OR_RETURN(PeerIdentity daemon, SocketPeer(session.get()));
  RETURN_IF_ERROR(
      CheckDaemonPeer(daemon, SessionSocketPath(socket_path), trusted_uid));
  ASSIGN_OR_RETURN(
      ReceivedMessage hello_msg,
      ReceiveWithFds(session.get(), sizeof(SessionRefused), 0,
                     std::max(Left(connect_deadline), kFdsTimeout)));
  absl::StatusOr<SessionMessage> hello =
      DecodeSessionMessage(hello_msg.payload);
  if (hello.ok() && hello->kind == SessionMessageKind::kRefused) {
    return absl::Status(
        hello->refusal.code(),
        absl::StrCat("gradd at ", socket_path,
                     " refused this trainer: ", hello->refusal.message()));
  }
  if (!hello.ok() || hello->kind != SessionMessageKind::kHello) {
    return absl::InternalError(absl::StrCat(
        "unexpected greeting from ", SessionSocketPath(socket_path), " (",
        hello.ok() ? "not a hello" : hello.status().message(),
        "); is it a gradd daemon?"));
  }

  // The gRPC socket must be served by the same daemon: the Attach request
  // carries the job id and every parameter name.
  ASSIGN_OR_RETURN(PeerIdentity rpc_peer, ProbeStreamSocketPeer(socket_path));
  RETURN_IF_ERROR(CheckDaemonPeer(rpc_peer, socket_path, trusted_uid));
  if (rpc_peer.pid != daemon.pid) {
    return absl::PermissionDeniedError(
        absl::StrCat("gradd's sockets are served by two processes: ",
                     SessionSocketPath(socket_path), " by pid ", daemon.pid,
                     ", ", socket_path, " by pid ", rpc_peer.pid,
                     "; refusing to send the attach request"));
  }

  grpc::ChannelArguments args;
  // Plans for models with many parameters exceed gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path),
                                grpc::InsecureChannelCredentials(), args);
  const auto connect_left =
      std::max<std::chrono::milliseconds>(Left(connect_deadline), kFdsTimeout);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 connect_left)) {
    return absl::UnavailableError(absl::StrCat(
        "gradd at ", socket_path,
        " accepted the session but its gRPC endpoint unix:", socket_path,
        " did not become ready within ", connect_left.count(), " ms"));
  }
  std::unique_ptr<v1::Node::Stub> stub = v1::Node::NewStub(channel);

  v1::AttachRequest request;
  request.set_job_id(options.job_id);
  request.set_local_rank(options.local_rank);
  request.set_local_world_size(options.local_world_size);
  request.set_session_id(hello->session_id);
  request.set_bucket_cap_mb(options.bucket_cap_mb);
  request.set_first_bucket_cap_mb(options.first_bucket_cap_mb);
  request.set_bucket_cap_auto(options.bucket_cap_auto);
  request.set_follows_plan_switches(options.bucket_cap_auto ||
                                    options.follow_plan_switches);
  // One area carries broadcasts and the other collectives: the larger of
  // the two sizes asked for (collectives.h's default for a collective-only
  // job).
  request.set_broadcast_bytes(CollectiveAreaBytes(options, params.size()));
  request.set_node_id(options.node_id);
  if (options.node_rank.has_value()) request.set_node_rank(*options.node_rank);
  request.set_num_nodes(options.num_nodes);
  request.set_coordinator(options.coordinator);
  *request.mutable_comm_hook() = CommHookToProto(options.comm_hook);
  if (options.rank_restart_grace_ms.has_value()) {
    request.set_rank_restart_grace_ms(*options.rank_restart_grace_ms);
  }
  if (options.min_nodes.has_value()) request.set_min_nodes(*options.min_nodes);
  request.set_divide_by_initial_world_size(
      options.divide_by_initial_world_size);
  bool cuda = false;
  for (const ClientParam& p : params) {
    v1::ParamSpec* spec = request.add_params();
    spec->set_name(p.name);
    for (int64_t d : p.shape) spec->add_shape(d);
    // Unchecked on purpose: the daemon validates and names bad dtypes and
    // devices.
    spec->set_dtype(static_cast<v1::DType>(p.dtype));
    spec->set_device(static_cast<v1::DeviceKind>(p.device));
    cuda = cuda || p.device == static_cast<int32_t>(v1::DEVICE_CUDA);
  }
  if (cuda) {
    absl::StatusOr<v1::CudaDevice> gpu =
        DeviceClient::Describe(options.cuda_device);
    if (!gpu.ok()) {
      return absl::Status(gpu.status().code(),
                          absl::StrCat("attach to gradd (job '", options.job_id,
                                       "', local rank ", options.local_rank,
                                       "): ", gpu.status().message()));
    }
    *request.mutable_cuda_device() = *std::move(gpu);
  }
  v1::AttachResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      After<std::chrono::system_clock>(options.attach_timeout));
  grpc::Status rpc = stub->Attach(&context, request, &response);
  if (!rpc.ok()) {
    absl::Status s = FromGrpcStatus(rpc);
    if (s.code() == absl::StatusCode::kDeadlineExceeded &&
        rpc.error_message() == "Deadline Exceeded") {
      // gRPC's own deadline beat the daemon's answer (which names the
      // missing ranks); say at least what we were waiting for.
      return absl::DeadlineExceededError(absl::StrCat(
          "attach to gradd at ", socket_path, " did not complete within ",
          "attach_timeout (", options.attach_timeout.count(),
          " ms): local rank ", options.local_rank, " of job '", options.job_id,
          "' waited for the other local ranks (local world ", "size ",
          options.local_world_size, ") to attach"));
    }
    return absl::Status(
        s.code(), absl::StrCat("attach to gradd at ", socket_path, " (job '",
                               options.job_id, "', local rank ",
                               options.local_rank, ") failed: ", s.message()));
  }

  ASSIGN_OR_RETURN(
      ReceivedMessage fds_msg,
      ReceiveWithFds(session.get(), sizeof(SessionFds), 5, kFdsTimeout));
  // A fifth fd, the rank's device memory, comes with CUDA buckets.
  const size_t expected_fds = response.device_memory_bytes() > 0 ? 5 : 4;
  absl::StatusOr<SessionMessage> fds_header =
      DecodeSessionMessage(fds_msg.payload);
  if (!fds_header.ok() || fds_header->kind != SessionMessageKind::kFds ||
      fds_msg.fds.size() != expected_fds) {
    return absl::InternalError(absl::StrCat(
        "gradd sent a malformed fd message (", fds_msg.payload.size(),
        " bytes, ", fds_msg.fds.size(), " fds)"));
  }
  if (fds_header->attach_id != response.attach_id()) {
    return absl::InternalError(absl::StrCat(
        "gradd's fd message does not match the attach (attach id ",
        fds_header->attach_id, ", expected ", response.attach_id(), ")"));
  }

  if (response.buckets_size() == 0 && !params.empty()) {
    return absl::InternalError("gradd returned a plan without buckets");
  }
  auto client = std::make_unique<ClientImpl>(
      options, socket_path,
      ControlLayout(static_cast<uint32_t>(options.local_world_size),
                    // Slots for any plan (bucket rebuild); older daemons
                    // size the block for the attach plan.
                    response.bucket_slots() > 0
                        ? response.bucket_slots()
                        : static_cast<uint32_t>(response.buckets_size())));
  client->SetConnection(std::move(session), hello->session_id, channel);
  if (expected_fds == 5) {
    absl::StatusOr<std::unique_ptr<DeviceClient>> device = DeviceClient::Import(
        options.cuda_device, std::move(fds_msg.fds[4]), response);
    if (!device.ok()) {
      return absl::Status(
          device.status().code(),
          absl::StrCat("job '", options.job_id, "', local rank ",
                       options.local_rank, ": importing the device memory ",
                       "gradd allocated failed: ", device.status().message()));
    }
    client->SetDevice(*std::move(device));
  }
  RETURN_IF_ERROR(client->Init(
      params, response, std::move(fds_msg.fds[0]), std::move(fds_msg.fds[1]),
      std::move(fds_msg.fds[2]), std::move(fds_msg.fds[3])));
  // The client detaches when it goes out of scope with this error.
  RETURN_IF_ERROR(
      CheckFormedWorld(options, client->world_size(), client->global_rank()));
  return std::unique_ptr<Client>(std::move(client));
}

// find_unused_parameters: attaches with the used map's hidden parameter
// registered first and returns the decorator (data/used_map_client.h).
absl::StatusOr<std::unique_ptr<Client>> AttachWithUsedMap(
    const ClientOptions& options, const std::vector<ClientParam>& params) {
  if (params.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", options.local_rank, " of job '",
                     options.job_id, "' registered no parameters"));
  }
  std::vector<ClientParam> all;
  all.reserve(params.size() + 1);
  all.push_back(ClientParam{kUsedMapParamName,
                            {static_cast<int64_t>(params.size())},
                            /*dtype=float32*/ 1});
  all.insert(all.end(), params.begin(), params.end());
  ASSIGN_OR_RETURN(std::unique_ptr<Client> inner, AttachDirect(options, all));
  if (inner->num_params() != static_cast<int>(all.size()) ||
      inner->gradient(0) == nullptr ||
      inner->gradient_bytes(0) != params.size() * sizeof(float)) {
    return absl::InternalError(
        absl::StrCat("gradd returned no memory for the used map of job '",
                     options.job_id, "', local rank ", options.local_rank));
  }
  std::vector<std::string> names;
  names.reserve(params.size());
  for (const ClientParam& p : params) names.push_back(p.name);
  return NewUsedMapClient(std::move(inner), std::move(names),
                          absl::StrCat("job '", options.job_id,
                                       "', local rank ", options.local_rank));
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<Client>> Client::Attach(
    const ClientOptions& options, const std::vector<ClientParam>& params) {
  if (options.find_unused_parameters) {
    return internal::AttachWithUsedMap(options, params);
  }
  return internal::AttachDirect(options, params);
}

}  // namespace gradd
