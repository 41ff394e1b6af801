// The bochscpu-python wheel is linked against glibc >= 2.38, whose headers route strtoull and sscanf
// to their C23 names; Debian 12's glibc 2.36 lacks those. Preloaded into the emulator's Python only.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

unsigned long long __isoc23_strtoull(const char* s, char** end, int base) { return strtoull(s, end, base); }

int __isoc23_sscanf(const char* s, const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  const int r = vsscanf(s, format, ap);
  va_end(ap);
  return r;
}
