// Which addresses belong to this host, and which one carries the daemons'
// traffic: the pieces coordinator discovery (coordinator.h) and the Gloo
// transport's advertised address are chosen from.
//
// All functions are plain, thread-safe and may block on name resolution
// (getaddrinfo), so callers run them off latency-sensitive threads.
#ifndef GRADD_SERVER_RENDEZVOUS_HOST_ADDRESSES_H_
#define GRADD_SERVER_RENDEZVOUS_HOST_ADDRESSES_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradd {

struct HostPort {
  std::string host;         // without brackets for IPv6 literals
  std::optional<int> port;  // absent when the text names only a host
};

// "h", "h:p", "[v6]", "[v6]:p", a bare IPv6 literal ("::1", no port).
// INVALID_ARGUMENT for an empty host or a port outside 1..65535.
[[nodiscard]] absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);
// host:port, bracketing IPv6 literals.
std::string JoinHostPort(absl::string_view host, int port);

// Numeric addresses of every interface that is up (loopback included).
std::vector<std::string> LocalAddresses();

// True if `host` (a name or a literal) resolves to an address of this host:
// loopback (127/8, ::1) or one of LocalAddresses(). False if it does not
// resolve.
bool IsLocalHost(const std::string& host);

// The first IPv4 address of interface `name` (IPv6 if it has none).
// NOT_FOUND naming the interfaces that exist when it has no address or does
// not exist.
[[nodiscard]] absl::StatusOr<std::string> InterfaceAddress(
    const std::string& name);

// The local address the kernel's routing table would send from to reach
// `host` (a UDP socket connected to it; nothing is sent). On a host with
// several interfaces this is the one that faces the peer, which is what the
// other daemons can reach. UNAVAILABLE if `host` does not resolve or has no
// route.
[[nodiscard]] absl::StatusOr<std::string> RouteSourceAddress(
    const std::string& host);

// The address this daemon's Gloo transport binds to and the other nodes
// connect to: `advertise_host` when set; else the address of `interface`
// (rendezvous.interface / GRADD_SOCKET_IFNAME) when set; else the source
// address of the route to `coordinator` (host:port), i.e. the interface that
// faces the cluster. Errors as InterfaceAddress / RouteSourceAddress.
[[nodiscard]] absl::StatusOr<std::string> AdvertiseAddress(
    const std::string& advertise_host, const std::string& interface_name,
    const std::string& coordinator);

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_HOST_ADDRESSES_H_
