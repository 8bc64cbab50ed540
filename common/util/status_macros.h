#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Propagates a non-OK absl::Status to the caller.
#define TANDEM_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status tandem_status_ = (expr);          \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (0)

#define TANDEM_CONCAT_INNER_(a, b) a##b
#define TANDEM_CONCAT_(a, b) TANDEM_CONCAT_INNER_(a, b)

// `TANDEM_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an OK StatusOr, else returns.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_CONCAT_(tandem_statusor_, __LINE__), lhs, expr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
