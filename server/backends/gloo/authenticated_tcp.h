// Gloo's TCP transport with a membership proof on every pair
// (auth/pair_handshake.h): a gloo::transport::tcp::Device whose contexts make
// pairs that let no byte of a connection reach Gloo before its other end
// proved that it holds the job's pair key.
//
// Why: a Gloo TCP pair listens on its own port and takes the FIRST
// connection that arrives (then closes the listener). A stranger who races
// the real peer to that port used to become the pair's peer: the real peer
// was refused and formation failed, and the stranger's bytes went straight
// into Gloo's reader, where a SEND_UNBOUND_BUFFER nobody asked for trips a
// GLOO_ENFORCE on Gloo's I/O thread and aborts the daemon.
//
// What these pairs do instead (Gloo 0.0~git20220518, Debian 12's; its
// tcp::Pair exposes the hooks as virtual/protected members, the same way
// Gloo's own TLS transport extends it, which Debian does not build):
//   listening side: the listener stays open and non-blocking; every
//     connection it accepts runs the server half of the handshake on its
//     own socket, off Gloo's reader. A connection that fails (wrong magic,
//     wrong proof, closed early) is closed, logged (warning naming the pair
//     and the address it came from; rate-limited) and counted; the listener
//     keeps waiting for the real peer. The first connection that proves
//     membership becomes the pair's socket; the listener and every other
//     pending connection are closed. At most kMaxPendingConnections wait at
//     once (when full, the oldest that has not sent its hello is dropped,
//     else the oldest), so a flood costs bounded memory. A stranger who
//     connects and stays silent costs nothing but a slot.
//   connecting side: after the TCP connect completes, the client half of
//     the handshake runs before the pair is CONNECTED; a listener that
//     cannot prove membership fails the pair ("pair to node X did not prove
//     membership of the job: ..."), and Gloo's connect throws that.
// If the real peer never proves itself, the pair's connect times out as
// before (the pair timeout), and the message counts the refused
// connections and says why the last one was refused.
//
// After the handshake the pair is Gloo's plain TCP pair: the per-message
// path only gains one check of a flag. The proof authenticates the ends; it
// does not encrypt or protect the traffic against an on-path attacker.
//
// Residual window: the listener exists from inside Gloo's Pair constructor;
// a connection accepted by Gloo's own handler in the instants before this
// class's constructor body runs (the port is not published yet) fails the
// pair rather than being used.
//
// Threads: the handshakes run on the device's I/O thread (Gloo's loop),
// never blocking it; the pair's mutex guards all state, as in Gloo.
#ifndef GRADD_SERVER_BACKENDS_GLOO_AUTHENTICATED_TCP_H_
#define GRADD_SERVER_BACKENDS_GLOO_AUTHENTICATED_TCP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

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
  // Connections to a pair's port that did not prove membership.
  std::atomic<uint64_t> refused{0};
  // Pairs whose other end proved membership.
  std::atomic<uint64_t> authenticated{0};
};

inline constexpr int kMaxPendingConnections = 8;

// A TCP device (as gloo::transport::tcp::CreateDevice(attr)) whose pairs run
// the handshake. Throws what Gloo's CreateDevice throws (callers catch at
// their Gloo edge). `counters` may be null.
std::shared_ptr<gloo::transport::Device> CreateAuthenticatedTcpDevice(
    const gloo::transport::tcp::attr& attr, PairAuthOptions options,
    std::shared_ptr<PairAuthCounters> counters);

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_GLOO_AUTHENTICATED_TCP_H_
