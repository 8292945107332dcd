// The attach path of the client library without any decoration: connects,
// registers exactly `params` and maps the shared memory (client.cc). Client::
// Attach() adds what ClientOptions asks for on top of it (e.g. the used map
// of find_unused_parameters, used_map_client.h).
#ifndef GRADD_CLIENT_SRC_SESSION_ATTACH_INTERNAL_H_
#define GRADD_CLIENT_SRC_SESSION_ATTACH_INTERNAL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gradd/client.h"

namespace gradd::internal {

absl::StatusOr<std::unique_ptr<Client>> AttachDirect(
    const ClientOptions& options, const std::vector<ClientParam>& params);

}  // namespace gradd::internal

#endif  // GRADD_CLIENT_SRC_SESSION_ATTACH_INTERNAL_H_
