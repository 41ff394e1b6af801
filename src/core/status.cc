// StrFormat and other small helpers for Status messages.
#include "core/status.h"

#include <cstdarg>

namespace lathe {

std::string StrFormat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? n : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), n + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

}  // namespace lathe
