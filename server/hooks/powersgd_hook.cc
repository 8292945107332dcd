#include "server/hooks/powersgd_hook.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<CommHookInterface>> MakePowerSgdHook(
    const v1::CommHookSpec& spec, const CommHookContext&) {
  return absl::UnimplementedError(
      absl::StrCat("communication hook '", spec.name(),
                   "' is not available in this gradd build yet"));
}

}  // namespace gradd
