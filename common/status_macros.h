// RETURN_IF_ERROR / ASSIGN_OR_RETURN: the one place these macros live.
#ifndef GRADD_COMMON_STATUS_MACROS_H_
#define GRADD_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GRADD_STATUS_CONCAT_INNER_(a, b) a##b
#define GRADD_STATUS_CONCAT_(a, b) GRADD_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status gradd_status_ = (expr);         \
    if (!gradd_status_.ok()) return gradd_status_; \
  } while (0)

#define GRADD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  GRADD_ASSIGN_OR_RETURN_IMPL_(     \
      GRADD_STATUS_CONCAT_(gradd_statusor_, __LINE__), lhs, expr)

#endif  // GRADD_COMMON_STATUS_MACROS_H_
