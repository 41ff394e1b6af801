// Status and Result<T>: how expected failures (bad file, bad config, out of budget) travel up.
// Messages must be actionable: name the file, key, tensor or offset and what was expected.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace lathe {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("loading foo.gguf: ") to an error; no-op on success.
  Status WithContext(const std::string& context) const {
    if (ok_) return *this;
    return Error(context + ": " + message_);
  }

 private:
  bool ok_ = true;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) {
      std::fprintf(stderr, "lathe: Result constructed from an OK Status\n");
      std::abort();
    }
  }
  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

// Formats like printf into a std::string.
std::string StrFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace lathe

#define LATHE_CONCAT_INNER(a, b) a##b
#define LATHE_CONCAT(a, b) LATHE_CONCAT_INNER(a, b)

#define LATHE_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::lathe::Status _st = (expr);            \
    if (!_st.ok()) return _st;               \
  } while (0)

#define LATHE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define LATHE_ASSIGN_OR_RETURN(lhs, expr) \
  LATHE_ASSIGN_OR_RETURN_IMPL(LATHE_CONCAT(_res_, __LINE__), lhs, expr)
