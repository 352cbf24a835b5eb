// Errors are values inside lib/: every fallible call returns Status or
// StatusOr<T>; errno, CURLcode and error_code are converted where they enter.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace spotvisor {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // bad configuration or input: the user must fix it
  kNotFound,
  kPermissionDenied,
  kUnavailable,  // transient: worth retrying
  kDeadlineExceeded,
  kCancelled,
  kFailedPrecondition,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return {}; }
inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status PermissionDeniedError(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// "what: strerror(err)" as a Status with a code that matches the errno.
Status ErrnoToStatus(int err, const std::string& what);

template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok());
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace spotvisor
