// Errors inside libfmha are C++ exceptions carrying a status and a message; the C entry
// points (api.cpp) catch them, store the message for fmha_last_error() and return the status.
#pragma once

#include <stdexcept>
#include <string>

#include "fmha/fmha.h"

namespace fmha {

class Error : public std::runtime_error {
 public:
  Error(fmha_status status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
  fmha_status status() const { return status_; }

 private:
  fmha_status status_;
};

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

// Sets the thread's last error message (empty clears it).
void set_last_error(const std::string& msg);

}  // namespace fmha

// Rejects an argument: FMHA_REQUIRE(p.head_dim <= 256, "head_dim %d exceeds 256", d).
#define FMHA_REQUIRE(cond, ...)                                                  \
  do {                                                                           \
    if (!(cond)) throw ::fmha::Error(FMHA_ERROR_INVALID_VALUE, ::fmha::format(__VA_ARGS__)); \
  } while (0)

#define FMHA_UNSUPPORTED(...) throw ::fmha::Error(FMHA_ERROR_NOT_SUPPORTED, ::fmha::format(__VA_ARGS__))
