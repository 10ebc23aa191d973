// Errors as values at module boundaries: a Status carries a message a user can act on, and
// Result<T> is a value or such a Status. Bad input never aborts; GGML_ASSERT-style checks are for
// our own bugs only.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace offgraph {

class [[nodiscard]] Status {
public:
  Status() = default;
  static Status error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string &message() const { return message_; }

private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
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
