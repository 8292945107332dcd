#include "server/backends/gloo/authenticated_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gloo/common/error.h"
#include "gloo/transport/buffer.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/unbound_buffer.h"
#include "server/auth/pair_handshake.h"
#include "server/backends/gloo/tcp_internal.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace tcp_internal {

// --------------------------------------------------------------- context

TcpContext::TcpContext(std::shared_ptr<const DeviceConfig> config, int rank,
                       int size)
    : gloo::transport::Context(rank, size), config_(std::move(config)) {
  pairs_.resize(size);
  pairs_mine_.resize(size, nullptr);
  pending_.reserve(kMaxPendingConnections);
  timeout_ = kDefaultTimeout;
  sockaddr_storage addr = config_->bind_addr;
  listen_fd_ =
      ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) GLOO_THROW_IO_EXCEPTION("socket: ", strerror(errno));
  socklen_t len = SockaddrLen(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, kListenBacklog) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    GLOO_THROW_IO_EXCEPTION("listening on ", config_->host, ": ",
                            strerror(err));
  }
  address_ = PairAddress(addr, rank);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    ::close(listen_fd_);
    GLOO_THROW_IO_EXCEPTION("eventfd: ", strerror(errno));
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpContext::~TcpContext() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  Wake();
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(pairs_mine_.begin(), pairs_mine_.end(), nullptr);
  }
  // The pairs use this object until they are gone.
  pairs_.clear();
  ::close(wake_fd_);
}

std::unique_ptr<gloo::transport::Pair>& TcpContext::createPair(int peer) {
  if (peer < 0 || peer >= size || peer == rank) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("no pair from rank ", rank,
                                           " to rank ", peer, " of ", size);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (pairs_[peer] != nullptr) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("the pair to rank ", peer,
                                           " exists already");
  }
  handshake_ms_ = getTimeout().count();
  auto pair = std::make_unique<TcpPair>(this, config_, peer, getTimeout());
  pairs_mine_[peer] = pair.get();
  pairs_[peer] = std::move(pair);
  return pairs_[peer];
}

TcpPair* TcpContext::PairTo(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer < 0 || peer >= size || pairs_mine_[peer] == nullptr) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("rank ", rank, " has no pair to ",
                                           peer, " (", size, " ranks)");
  }
  return pairs_mine_[peer];
}

void TcpContext::FailAll(const std::string& why) {
  for (TcpPair* pair : AllPairs()) {
    if (pair != nullptr) pair->FailWithNotice(why);
  }
}

void TcpContext::OnPairConnected() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++connected_;
  }
  Wake();
}

std::string TcpContext::RefusalNote() {
  std::lock_guard<std::mutex> lock(mu_);
  if (refused_ == 0) return "";
  return absl::StrCat(" [the pair port of ", config_->NodeName(rank),
                      " refused ", refused_,
                      " connection(s) that did not prove membership of the "
                      "job; the last ",
                      last_refusal_, "]");
}

void TcpContext::AcceptLoop() {
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Every pair is in: nobody else may connect.
      if (closing_ || connected_ >= size - 1) break;
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point next = Clock::now() + std::chrono::hours(1);
    for (const Pending& p : pending_) {
      const bool out = p.out_pos < p.out.size();
      fds.push_back(
          {p.fd, static_cast<short>(POLLIN | (out ? POLLOUT : 0)), 0});
      next = std::min(next, p.deadline);
    }
    const auto wait =
        std::chrono::duration_cast<milliseconds>(next - Clock::now());
    const int n =
        ::poll(fds.data(), fds.size(),
               static_cast<int>(std::max<int64_t>(0, wait.count()) + 1));
    if (n < 0 && errno != EINTR) {
      spdlog::warn("{}: polling the pair port: {}", Where(), strerror(errno));
      break;
    }
    if (fds[0].revents != 0) {
      uint64_t drained;
      (void)!::read(wake_fd_, &drained, sizeof(drained));
    }
    // Pending connections first (by descriptor: slots move as they go).
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      for (Pending& p : pending_) {
        if (p.fd == fds[i].fd) {
          Progress(&p);
          break;
        }
      }
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                    [](const Pending& p) { return p.fd < 0; }),
                     pending_.end());
    }
    if (fds[1].revents != 0) AcceptSome();
    const Clock::time_point now = Clock::now();
    for (Pending& p : pending_) {
      if (p.fd >= 0 && now >= p.deadline) {
        Refuse(&p, "it did not complete the handshake in time");
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const Pending& p) { return p.fd < 0; }),
                   pending_.end());
  }
  // Every pair is connected, so whoever is still waiting, or still queued
  // in the kernel, is not a member of the job: refused, logged and counted
  // like any stranger (gloo_backend.h), not dropped unseen when the port
  // closes.
  constexpr absl::string_view kLate =
      "every pair of the job was connected already";
  for (Pending& p : pending_) Refuse(&p, kLate);
  pending_.clear();
  for (int i = 0; i < kMaxQueuedAtClose; ++i) {
    Pending queued;
    if (!AcceptOne(&queued)) break;
    Refuse(&queued, kLate);
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
}

Pending* TcpContext::FreeSlot() {
  if (pending_.size() < static_cast<size_t>(kMaxPendingConnections)) {
    pending_.emplace_back();
    return &pending_.back();
  }
  // Full: drop the oldest connection that has not even sent its hello (the
  // real peer sends it at once), else the oldest.
  Pending* oldest = nullptr;
  for (Pending& p : pending_) {
    const bool silent = p.step == Pending::Step::kHello;
    const bool oldest_silent =
        oldest != nullptr && oldest->step == Pending::Step::kHello;
    if (oldest == nullptr || (silent && !oldest_silent) ||
        (silent == oldest_silent && p.order < oldest->order)) {
      oldest = &p;
    }
  }
  Refuse(oldest, absl::StrCat("dropped: ", kMaxPendingConnections,
                              " newer connections were waiting"));
  *oldest = Pending();
  return oldest;
}

bool TcpContext::AcceptOne(Pending* p) {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr),
                             &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("{}: accepting on the pair port: {}", Where(),
                     strerror(errno));
      }
      return false;
    }
    p->fd = fd;
    p->from = AddressText(addr);
    return true;
  }
}

void TcpContext::AcceptSome() {
  // Bounded per wake-up so the pending connections keep their turn.
  for (int i = 0; i < kMaxPendingConnections; ++i) {
    Pending accepted;
    if (!AcceptOne(&accepted)) return;
    SetNoDelay(accepted.fd);
    Pending* p = FreeSlot();
    p->fd = accepted.fd;
    p->order = next_order_++;
    p->from = std::move(accepted.from);
    p->deadline = Clock::now() + milliseconds(handshake_ms_.load());
    // The hello may already be here.
    Progress(p);
  }
}

void TcpContext::Progress(Pending* p) {
  using Step = Pending::Step;
  for (;;) {
    int err = 0;
    if (p->out_pos < p->out.size()) {
      const Io sent = SendSome(p->fd, p->out, &p->out_pos, &err);
      if (sent == Io::kAgain) return;
      if (sent != Io::kDone) {
        Refuse(p,
               absl::StrCat("sending the handshake failed: ", strerror(err)));
        return;
      }
    }
    if (p->step == Step::kAck) {
      HandOver(p);
      return;
    }
    const size_t need =
        p->step == Step::kHello ? kPairHelloBytes : kPairFinishBytes;
    const Io io = RecvUpTo(p->fd, &p->in, need, &err);
    if (p->step == Step::kHello && !CouldBePairHello(p->in)) {
      Refuse(p, "the connection did not open with a gradd pair handshake");
      return;
    }
    if (io == Io::kAgain) return;
    if (io == Io::kClosed) {
      Refuse(p, "it closed the connection before proving membership");
      return;
    }
    if (io == Io::kError) {
      Refuse(p, absl::StrCat("reading the handshake failed: ", strerror(err)));
      return;
    }
    absl::StatusOr<std::string> next;
    if (p->step == Step::kHello) {
      // The hello's layout (auth/pair_handshake.h): magic (8) | client
      // rank | server rank | nonce. The client rank picks the pair; the
      // handshake checks the rest.
      const uint32_t client = GetU32(p->in.data() + 8);
      if (client <= static_cast<uint32_t>(rank) ||
          client >= static_cast<uint32_t>(size)) {
        Refuse(p,
               absl::StrCat("its hello is from rank ", client, "; ranks ",
                            rank + 1, "..", size - 1, " connect to this port"));
        return;
      }
      p->client = static_cast<int>(client);
      TcpPair* pair = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pair = pairs_mine_[p->client];
      }
      if (pair == nullptr || !pair->Waiting()) {
        Refuse(p, "the pair is not waiting for a connection");
        return;
      }
      absl::StatusOr<PairHandshakeServer> handshake =
          PairHandshakeServer::Create(config_->options.key, rank, client);
      if (!handshake.ok()) {
        Refuse(p, handshake.status().message());
        return;
      }
      p->handshake.emplace(*std::move(handshake));
      next = p->handshake->OnHello(p->in);
    } else {
      next = p->handshake->OnFinish(p->in);
    }
    if (!next.ok()) {
      Refuse(p, next.status().message());
      return;
    }
    p->in.clear();
    p->out = *std::move(next);
    p->out_pos = 0;
    p->step = p->step == Step::kHello ? Step::kFinish : Step::kAck;
  }
}

void TcpContext::Refuse(Pending* p, absl::string_view why) {
  uint64_t refused = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused = ++refused_;
    last_refusal_ = absl::StrCat("came from ", p->from, ": ", why);
  }
  if (PairAuthCounters* c = config_->counters.get()) ++c->refused;
  const std::string pair =
      p->client > rank && p->client < size
          ? absl::StrCat("the pair to ", config_->NodeName(p->client))
          : "this node's pairs";
  // Rate-limited: a stranger may connect in a loop.
  if (refused <= 3 || refused % 100 == 0) {
    spdlog::warn(
        "{}",
        absl::StrCat(
            Where(), ": refused a connection from ", p->from,
            " to the Gloo port of ", pair,
            ": it did not prove membership of the job (", why, ")",
            refused > 3 ? absl::StrCat("; ", refused, " refused so far") : ""));
  }
  Drop(p);
}

void TcpContext::Drop(Pending* p) {
  if (p->fd < 0) return;
  CloseWithReset(p->fd);
  p->fd = -1;
  p->handshake.reset();
}

void TcpContext::HandOver(Pending* p) {
  TcpPair* pair = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pair = pairs_mine_[p->client];
  }
  const int fd = p->fd;
  p->fd = -1;
  p->handshake.reset();
  if (pair == nullptr) {
    CloseWithReset(fd);
    return;
  }
  if (PairAuthCounters* c = config_->counters.get()) ++c->authenticated;
  (void)pair->Establish(fd, p->from);
}

// ---------------------------------------------------------------- device

class TcpDevice final : public gloo::transport::Device {
 public:
  explicit TcpDevice(std::shared_ptr<const DeviceConfig> config)
      : config_(std::move(config)) {}

  std::string str() const override {
    return absl::StrCat("gradd-tcp:", config_->host);
  }
  const std::string& getPCIBusID() const override { return pci_bus_id_; }
  std::shared_ptr<gloo::transport::Context> createContext(int rank,
                                                          int size) override {
    return std::make_shared<TcpContext>(config_, rank, size);
  }

 private:
  const std::shared_ptr<const DeviceConfig> config_;
  const std::string pci_bus_id_;
};

}  // namespace tcp_internal

using tcp_internal::AddressText;
using tcp_internal::DeviceConfig;
using tcp_internal::GetU32;
using tcp_internal::kAddressMagic;
using tcp_internal::PutU32;
using tcp_internal::SockaddrLen;
using tcp_internal::TcpDevice;

// --------------------------------------------------------------- address

PairAddress::PairAddress(const sockaddr_storage& addr, int rank)
    : addr_(addr), rank_(rank) {}

socklen_t PairAddress::sockaddr_len() const { return SockaddrLen(addr_); }

std::string PairAddress::str() const { return AddressText(addr_); }

std::vector<char> PairAddress::bytes() const {
  std::vector<char> out(kBytes, 0);
  std::memcpy(out.data(), kAddressMagic.data(), 4);
  PutU32(out.data() + 4, static_cast<uint32_t>(rank_));
  uint16_t port = 0;
  if (addr_.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr_);
    port = ntohs(in6.sin6_port);
    std::memcpy(out.data() + 12, &in6.sin6_addr, 16);
  } else {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr_);
    port = ntohs(in.sin_port);
    std::memcpy(out.data() + 12, &in.sin_addr, 4);
  }
  out[8] = static_cast<char>(addr_.ss_family >> 8);
  out[9] = static_cast<char>(addr_.ss_family & 0xff);
  out[10] = static_cast<char>(port >> 8);
  out[11] = static_cast<char>(port & 0xff);
  return out;
}

absl::StatusOr<PairAddress> PairAddress::Parse(const std::vector<char>& bytes) {
  if (bytes.size() != kBytes ||
      absl::string_view(bytes.data(), 4) != kAddressMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a gradd pair address (", bytes.size(), " bytes)"));
  }
  const int family =
      (static_cast<uint8_t>(bytes[8]) << 8) | static_cast<uint8_t>(bytes[9]);
  const uint16_t port = static_cast<uint16_t>(
      (static_cast<uint8_t>(bytes[10]) << 8) | static_cast<uint8_t>(bytes[11]));
  sockaddr_storage addr{};
  if (family == AF_INET6) {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(addr);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(port);
    std::memcpy(&in6.sin6_addr, bytes.data() + 12, 16);
  } else if (family == AF_INET) {
    auto& in = reinterpret_cast<sockaddr_in&>(addr);
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    std::memcpy(&in.sin_addr, bytes.data() + 12, 4);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradd pair address of family ", family));
  }
  return PairAddress(addr, static_cast<int>(GetU32(bytes.data() + 4)));
}

absl::StatusOr<std::shared_ptr<gloo::transport::Device>>
CreateAuthenticatedTcpDevice(const std::string& host, PairAuthOptions options,
                             std::shared_ptr<PairAuthCounters> counters) {
  if (options.key.size() != kPairKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pair key has ", kPairKeyBytes, " bytes, not ", options.key.size()));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Gloo transport's host '", host,
                     "' does not resolve: ", gai_strerror(rc)));
  }
  auto config = std::make_shared<DeviceConfig>();
  std::memcpy(&config->bind_addr, found->ai_addr,
              std::min<size_t>(found->ai_addrlen, sizeof(sockaddr_storage)));
  freeaddrinfo(found);
  // Port 0: each context's listener gets one from the OS.
  if (config->bind_addr.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6&>(config->bind_addr).sin6_port = 0;
  } else {
    reinterpret_cast<sockaddr_in&>(config->bind_addr).sin_port = 0;
  }
  config->host = host;
  config->options = std::move(options);
  config->counters = std::move(counters);
  return std::shared_ptr<gloo::transport::Device>(
      std::make_shared<TcpDevice>(std::move(config)));
}

}  // namespace gradd
