// Errors as values at module boundaries: a Status carries a message a user can act on, and
// Result<T> is a value or such a Status. Bad input never aborts; GGML_ASSERT-style checks are for
// our own bugs only.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace offgraph {

// What kind of failure a Status is, for callers that act on the kind rather than the text (the
// server's HTTP status, a retry).
enum class StatusCode {
  kOk,
  kInvalidArgument,   // the input is wrong: the message says which and why (the default)
  kNotFound,          // a name that nothing answers to
  kResourceExhausted, // a limit is reached for now (a full queue): the same call may succeed later
  kUnavailable,       // the service takes no work at the moment (loading, shutting down)
  kUnimplemented,     // valid, and not supported
  kInternal,          // our failure, not the caller's (an allocation, a backend)
};

class [[nodiscard]] Status {
public:
  Status() = default;
  static Status error(std::string message, StatusCode code = StatusCode::kInvalidArgument) {
    assert(code != StatusCode::kOk);
    return Status(std::move(message), code == StatusCode::kOk ? StatusCode::kInternal : code);
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string &message() const { return message_; }

private:
  Status(std::string message, StatusCode code) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }

template <class T> class [[nodiscard]] Result {
public:
  Result(T value) : state_(std::move(value)) {} // NOLINT
  Result(Status status) : state_(std::move(status)) {
    assert(!std::get<Status>(state_).ok());
  } // NOLINT

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }

  const T &value() const & { return std::get<T>(state_); }
  T &value() & { return std::get<T>(state_); }
  T &&value() && { return std::get<T>(std::move(state_)); }
  const T &operator*() const & { return value(); }
  T &operator*() & { return value(); }
  const T *operator->() const { return &value(); }
  T *operator->() { return &value(); }

  // The failure; an ok Result reports an ok Status.
  Status status() const { return ok() ? Status() : std::get<Status>(state_); }
  const std::string &message() const {
    static const std::string none;
    return ok() ? none : std::get<Status>(state_).message();
  }

private:
  std::variant<T, Status> state_;
};

} // namespace offgraph

// Returns the Status of `expr` from the enclosing function (which returns Status or Result) when
// it failed.
#define OFFGRAPH_TRY(expr)                                                                         \
  do {                                                                                             \
    if (::offgraph::Status _s = (expr); !_s.ok()) return _s;                                       \
  } while (0)
