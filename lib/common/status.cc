#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace spotvisor {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status ErrnoToStatus(int err, const std::string& what) {
  std::string msg = what + ": " + std::strerror(err);
  switch (err) {
    case ENOENT: return NotFoundError(std::move(msg));
    case EACCES:
    case EPERM: return PermissionDeniedError(std::move(msg));
    case EINVAL: return InvalidArgumentError(std::move(msg));
    case EAGAIN:
    case EBUSY:  // in use right now: may work later
    case EINTR: return UnavailableError(std::move(msg));
    default: return InternalError(std::move(msg));
  }
}

}  // namespace spotvisor
