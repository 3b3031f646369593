#include "error.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace fmha {

namespace {
thread_local std::string t_last_error;
}  // namespace

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out;
  if (n > 0) {
    std::vector<char> buf(static_cast<size_t>(n) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, args);
    out.assign(buf.data(), static_cast<size_t>(n));
  }
  va_end(args);
  return out;
}

void set_last_error(const std::string& msg) { t_last_error = msg; }

}  // namespace fmha

extern "C" FMHA_API const char* fmha_last_error(void) { return fmha::t_last_error.c_str(); }
