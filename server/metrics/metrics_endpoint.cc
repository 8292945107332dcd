#include "server/metrics/metrics_endpoint.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Create(
    const std::string& address,
    std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->registry_ = std::move(registry);
  try {
    // ":port" (every interface) is spelled with the IPv4 wildcard for
    // civetweb.
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(
        address.rfind(':', 0) == 0 ? absl::StrCat("0.0.0.0", address)
                                   : address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  }
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": not listening"));
  }
  endpoint->port_ = ports.front();
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  return endpoint;
}

}  // namespace gradd
