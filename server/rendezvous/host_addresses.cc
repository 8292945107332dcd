#include "server/rendezvous/host_addresses.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradd {
namespace {

// Numeric form of an AF_INET/AF_INET6 sockaddr; empty for other families.
std::string Numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf,
              sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
              buf, sizeof(buf));
  }
  return buf;
}

bool IsLoopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const uint32_t a =
        ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a);
  }
  return false;
}

// Owns a getaddrinfo result.
struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

int Resolve(const std::string& host, int socktype, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  return getaddrinfo(host.c_str(), nullptr, &hints, &out->head);
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  HostPort out;
  absl::string_view port_text;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", text, "': unbalanced '['"));
    }
    out.host = std::string(text.substr(1, close - 1));
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return absl::InvalidArgumentError(
            absl::StrCat("address '", text, "': junk after ']'"));
      }
      port_text = rest.substr(1);
      has_port = true;
    }
  } else if (std::count(text.begin(), text.end(), ':') > 1) {
    out.host = std::string(text);  // a bare IPv6 literal: no port
  } else if (const size_t colon = text.rfind(':');
             colon != absl::string_view::npos) {
    out.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    has_port = true;
  } else {
    out.host = std::string(text);
  }
  if (out.host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", text, "' names no host"));
  }
  if (has_port) {
    int port = 0;
    if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "address '", text, "': port '", port_text, "' is not in 1..65535"));
    }
    out.port = port;
  }
  return out;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    std::string a = Numeric(i->ifa_addr);
    if (!a.empty()) out.push_back(std::move(a));
  }
  freeifaddrs(list);
  return out;
}

bool IsLocalHost(const std::string& host) {
  AddrInfo resolved;
  if (Resolve(host, SOCK_STREAM, &resolved) != 0) return false;
  const std::vector<std::string> mine = LocalAddresses();
  for (addrinfo* a = resolved.head; a != nullptr; a = a->ai_next) {
    if (IsLoopback(a->ai_addr)) return true;
    if (std::find(mine.begin(), mine.end(), Numeric(a->ai_addr)) !=
        mine.end()) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::UnavailableError(
        absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string v4, v6;
  std::vector<std::string> names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end()) {
      names.push_back(i->ifa_name);
    }
    if (name != i->ifa_name || i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      v4 = Numeric(i->ifa_addr);
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      const in6_addr& a =
          reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (!IN6_IS_ADDR_LINKLOCAL(&a)) v6 = Numeric(i->ifa_addr);
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError(
      absl::StrCat("network interface '", name, "' ",
                   std::find(names.begin(), names.end(), name) == names.end()
                       ? "does not exist"
                       : "has no IPv4 or global IPv6 address",
                   " (interfaces: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<std::string> RouteSourceAddress(const std::string& host) {
  AddrInfo resolved;
  if (int rc = Resolve(host, SOCK_DGRAM, &resolved); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = resolved.head; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // Any port will do: connect() on UDP only selects the route.
    sockaddr_storage target{};
    std::memcpy(&target, a->ai_addr, a->ai_addrlen);
    reinterpret_cast<sockaddr_in*>(&target)->sin_port = htons(9);
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, reinterpret_cast<sockaddr*>(&target), a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      close(fd);
      return Numeric(reinterpret_cast<sockaddr*>(&local));
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  return absl::UnavailableError(
      absl::StrCat("no route to '", host, "': ", last_error));
}

absl::StatusOr<std::string> AdvertiseAddress(const std::string& advertise_host,
                                             const std::string& interface_name,
                                             const std::string& coordinator) {
  if (!advertise_host.empty()) return advertise_host;
  if (!interface_name.empty()) return InterfaceAddress(interface_name);
  absl::StatusOr<HostPort> parsed = ParseHostPort(coordinator);
  if (!parsed.ok()) return parsed.status();
  return RouteSourceAddress(parsed->host);
}

}  // namespace gradd
