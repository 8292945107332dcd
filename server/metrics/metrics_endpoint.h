// MetricsEndpoint: serves a prometheus-cpp registry as /metrics over HTTP
// (prometheus-cpp's Exposer, civetweb underneath) on metrics.listen_address.
//
// Owns the exposer and its threads; scrapes run on them and only read the
// registry. Create() reports an address that cannot be bound as
// UNAVAILABLE naming it (prometheus-cpp throws; this is the edge where that
// becomes a status).
#ifndef GRADD_SERVER_METRICS_METRICS_ENDPOINT_H_
#define GRADD_SERVER_METRICS_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace gradd {

class MetricsEndpoint {
 public:
  // `address`: host:port (port 0: OS-chosen; see port()).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Create(
      const std::string& address,
      std::shared_ptr<prometheus::Registry> registry);

  // The port it listens on.
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_METRICS_METRICS_ENDPOINT_H_
