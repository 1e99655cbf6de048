#pragma once
// status and result<T>: how every kstate module reports failure.
//
// A small set of codes, each saying what the caller should do. Third-party errors
// (rocksdb::Status, rd_kafka_resp_err_t) are converted at the module edge. A missing
// key is not an error: lookups return an empty optional.

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kstate {

enum class status_code {
  ok,
  invalid_argument,    // the caller's input is wrong: fix it, don't retry
  not_found,           // a named thing (store, topic) does not exist: don't retry
  unavailable,         // transient (not caught up, rebalancing): retry later or elsewhere
  deadline_exceeded,   // ran out of time: retry with a longer deadline
  resource_exhausted,  // over a configured limit: reduce the request
  io_error,            // storage or network failure: retry may help, alert an operator
  corruption,          // data on disk is damaged: operator action needed
  internal,            // a bug: report it
};

const char* to_string(status_code c) noexcept;

// The analyzer does not model std::variant and takes a status copied out of a
// result<T> for garbage:
// NOLINTNEXTLINE(clang-analyzer-core.uninitialized.Assign)
class [[nodiscard]] status {
 public:
  status() = default;  // ok

  // One factory per failure code: the only way to make a non-ok status.
  static status ok_status() { return {}; }
  static status invalid_argument(std::string m) { return {status_code::invalid_argument, std::move(m)}; }
  static status not_found(std::string m) { return {status_code::not_found, std::move(m)}; }
  static status unavailable(std::string m) { return {status_code::unavailable, std::move(m)}; }
  static status deadline_exceeded(std::string m) { return {status_code::deadline_exceeded, std::move(m)}; }
  static status resource_exhausted(std::string m) { return {status_code::resource_exhausted, std::move(m)}; }
  static status io_error(std::string m) { return {status_code::io_error, std::move(m)}; }
  static status corruption(std::string m) { return {status_code::corruption, std::move(m)}; }
  static status internal(std::string m) { return {status_code::internal, std::move(m)}; }

  bool ok() const noexcept { return code_ == status_code::ok; }
  status_code code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  std::string to_string() const;

  // The same code, with `context` in front of the message ("context: message"), for a
  // caller that adds what it was doing while passing a failure on.
  status prefixed(std::string_view context) const { return {code_, std::string(context) + ": " + message_}; }

 private:
  status(status_code code, std::string message) : code_(code), message_(std::move(message)) {}

  status_code code_ = status_code::ok;
  std::string message_;
};

// result<T>: a value or a non-ok status.
template <typename T>
class [[nodiscard]] result {
 public:
  result(T value) : v_(std::move(value)) {}                                    // NOLINT: implicit by design
  result(status s) : v_(std::move(s)) { assert(!std::get<status>(v_).ok()); }  // NOLINT

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const status& error() const { return std::get<status>(v_); }

 private:
  std::variant<T, status> v_;
};

}  // namespace kstate
