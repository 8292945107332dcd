// gradd's own Gloo transport: TCP connections between node daemons, each of
// which proves membership of the job (auth/pair_handshake.h) before it
// carries a byte of Gloo traffic. It implements Gloo's public abstract
// transport (gloo/transport/{device,context,pair,unbound_buffer,address}.h)
// and nothing of Gloo's TCP transport, whose private state changes between
// Gloo versions (Debian 12's 0.0~git20220518 and Debian 13's
// 0.0~git20231202 both build this file unchanged).
//
// Why a transport of our own: Gloo's TCP pair takes the FIRST connection
// that reaches its port. A stranger who raced the real peer became the
// pair's peer (formation failed), and its bytes went straight into Gloo's
// reader, where an unsolicited message aborts the daemon. The membership
// proof has to sit between accept() and the first byte Gloo reads, and
// Gloo exposes no hook there (its TLS transport, which would, is not built
// by Debian).
//
// Connections:
//   - every context (one per Gloo mesh; gradd makes one device and one
//     context per mesh) listens on ONE port bound to the advertised host's
//     address, the port chosen by the OS; every pair of the context
//     publishes that address (Address below: fixed size, so Gloo's
//     rendezvous can slice one node's concatenated addresses per pair).
//     One listener per context rather than per device: the handshake's
//     hello names the client's and the server's rank, which identify a pair
//     only within one context; and it leaves the handshake's wire format
//     (docs/protocol.md) unchanged.
//   - the higher rank of a pair connects, the lower one listens: one TCP
//     connection per pair, carrying both directions.
//   - listening side: an accept thread polls the listener and the pending
//     connections (non-blocking). Each connection runs the server half of
//     the handshake; its hello names the client rank, which selects the
//     pair. A connection that fails (wrong magic, wrong ranks, a pair
//     already connected, a proof that does not verify, closed early, or no
//     complete handshake within the pair timeout) is closed, logged
//     (warning naming the pair and the address it came from; rate-limited)
//     and counted in PairAuthCounters::refused; the listener keeps waiting.
//     At most kMaxPendingConnections wait at once (when full, the oldest
//     that has not sent its hello is dropped, else the oldest), so a flood
//     costs bounded memory, and a stranger who connects and stays silent
//     costs a slot, never the real peer's turn. The listener closes once
//     every pair of the context is connected; connections still pending or
//     queued then are refused as above ("every pair of the job was
//     connected already"), not dropped unseen.
//   - connecting side: connect, then the client half of the handshake, each
//     step bounded by the pair timeout; a listener that cannot prove
//     membership fails the pair ("pair to node X at <address> did not prove
//     membership of the job: ..."), and Gloo's connectFullMesh throws that.
//   - a listening pair whose peer never proves itself times out after the
//     pair timeout; the message counts the connections this context's port
//     refused and says why the last one was refused.
// The proof authenticates the ends; it does not encrypt or protect the
// traffic against an on-path attacker.
//
// Data path (after the handshake), per pair:
//   frame = slot (u64) | nbytes (u64) | payload, in host byte order (the
//   daemons of one job run the same build on the same architecture).
//   - a receive thread reads each frame's header, then the payload straight
//     into the receive posted for that slot (first posted, first matched;
//     zero copy), or, when none is posted yet, into a buffer of its own
//     that the next receive posted for the slot copies from. It always
//     drains the socket, so eager sends cannot deadlock a ring.
//   - sends are eager: the caller's thread writes what the socket takes
//     without blocking; the rest goes to the pair's send thread (so a send
//     never blocks the caller, as in Gloo, and a small message costs no
//     thread hand-off). Frames of one pair go out in posting order.
// Messages between a pair on one slot match in posting order. waitRecv/
// waitSend return false after abortWait*, and throw gloo::IoException when
// a pair of a pending operation failed ("Connection closed by peer
// <address>", "Read error <address>: ..."; <address> is always the peer's
// published address, whichever end connected, so GlooBackend can name the
// node) or when the wait timed out ("Timed out waiting <n>ms for recv
// operation to complete"). As in Gloo's TCP transport, a timeout fails
// every pair of the context: the operation's buffers may go away with the
// exception, and nothing may still write into them. Unlike Gloo, each peer
// is first told why (a notice frame), so a node waiting on one that gave up
// reports "Peer <address> ended the connection: Timed out ..." -- a timeout
// down the chain, not a lost peer. Receiving from any of
// several ranks (recv(vector<int>, ...)) is not supported (gradd does not
// use it) and throws gloo::InvalidOperationException; so do Gloo's old
// bound buffers (createSendBuffer/createRecvBuffer).
//
// Threads: per context one accept thread while the mesh forms; per
// connected pair one receive and one send thread. A buffer's destructor
// waits until no pair thread uses it (the context's connections closed,
// that is at once). Errors cross to Gloo as Gloo's exceptions (this is the
// Gloo edge); CreateAuthenticatedTcpDevice itself returns a status.
#ifndef GRADD_SERVER_BACKENDS_GLOO_AUTHENTICATED_TCP_H_
#define GRADD_SERVER_BACKENDS_GLOO_AUTHENTICATED_TCP_H_

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gloo/transport/address.h"
#include "gloo/transport/device.h"

namespace gradd {

struct PairAuthOptions {
  // The job's pair key (kPairKeyBytes), the same on every node of the mesh.
  std::string key;
  // For messages: the job and the node names by node rank (may be empty).
  std::string job_id;
  std::vector<std::string> node_names;
};

// What the pairs of one device saw; readable from any thread.
struct PairAuthCounters {
  // Connections to a pair port that did not prove membership.
  std::atomic<uint64_t> refused{0};
  // Pairs whose other end proved membership (counted on both ends).
  std::atomic<uint64_t> authenticated{0};
};

inline constexpr int kMaxPendingConnections = 8;
// When the last pair is connected, the connections still queued on the
// port (strangers: every member is in) are accepted and refused, up to this
// many; the rest are reset when the port closes.
inline constexpr int kMaxQueuedAtClose = 256;

// A context's listening address as its pairs publish it.
class PairAddress final : public gloo::transport::Address {
 public:
  // The wire form: "gpa1" | owner rank (u32 BE) | family (u16 BE) |
  // port (u16 BE) | IP (16 bytes, an IPv4 address in the first 4).
  static constexpr size_t kBytes = 4 + 4 + 2 + 2 + 16;

  PairAddress() = default;
  PairAddress(const sockaddr_storage& addr, int rank);
  // INVALID_ARGUMENT unless `bytes` is one address's wire form.
  static absl::StatusOr<PairAddress> Parse(const std::vector<char>& bytes);

  // "127.0.0.1:port" or "[::1]:port".
  std::string str() const override;
  std::vector<char> bytes() const override;
  const sockaddr_storage& sockaddr() const { return addr_; }
  socklen_t sockaddr_len() const;
  int rank() const { return rank_; }

 private:
  sockaddr_storage addr_{};
  int rank_ = -1;
};

// A device whose contexts make authenticated pairs. `host` (an IP address
// or a name resolved now) is the address the listeners bind to and
// publish. `counters` may be null. Errors: INVALID_ARGUMENT (a host that
// does not resolve), INVALID_ARGUMENT when the key is not kPairKeyBytes.
[[nodiscard]] absl::StatusOr<std::shared_ptr<gloo::transport::Device>>
CreateAuthenticatedTcpDevice(const std::string& host, PairAuthOptions options,
                             std::shared_ptr<PairAuthCounters> counters);

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_GLOO_AUTHENTICATED_TCP_H_
