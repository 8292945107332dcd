// PowerSGD (torch's powerSGD_hook / batched_powerSGD_hook) in the daemon.
// See powersgd_hook.cc.
#ifndef GRADD_SERVER_HOOKS_POWERSGD_HOOK_H_
#define GRADD_SERVER_HOOKS_POWERSGD_HOOK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gradd/v1/comm_hook.pb.h"
#include "server/hooks/comm_hook.h"
#include "server/hooks/comm_hook_factory.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<CommHookInterface>> MakePowerSgdHook(
    const v1::CommHookSpec& spec, const CommHookContext& context);

}  // namespace gradd

#endif  // GRADD_SERVER_HOOKS_POWERSGD_HOOK_H_
