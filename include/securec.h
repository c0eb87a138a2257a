// SPDX-License-Identifier: Apache-2.0
// kvblocks: a minimal stand-in for the bounds-checked C functions of Huawei's securec library that
// CANN samples call (memcpy_s, memmove_s, memset_s, strcpy_s, strncpy_s, strcat_s, sprintf_s,
// snprintf_s), header-only. Each checks the destination size first and returns EOK (0) on success;
// on a bad argument it returns EINVAL, when the result would not fit ERANGE, and (like securec)
// clears a string destination it could not fill. Our own text; see docs/compat.md.
#ifndef KVBLOCKS_SECUREC_H_
#define KVBLOCKS_SECUREC_H_

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifndef EOK
#define EOK 0
#endif
#ifndef KVBLOCKS_SECUREC_ERRNO_T
#define KVBLOCKS_SECUREC_ERRNO_T
typedef int errno_t;
#endif

static inline errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count) {
  if (count == 0) return EOK;
  if (dest == NULL || src == NULL) return EINVAL;
  if (count > destMax) return ERANGE;
  memmove(dest, src, count);
  return EOK;
}
static inline errno_t memmove_s(void *dest, size_t destMax, const void *src, size_t count) {
  return memcpy_s(dest, destMax, src, count);
}
static inline errno_t memset_s(void *dest, size_t destMax, int c, size_t count) {
  if (count == 0) return EOK;
  if (dest == NULL) return EINVAL;
  if (count > destMax) return ERANGE;
  memset(dest, c, count);
  return EOK;
}
static inline errno_t strncpy_s(char *strDest, size_t destMax, const char *strSrc, size_t count) {
  if (strDest == NULL || destMax == 0) return EINVAL;
  if (strSrc == NULL) {
    strDest[0] = '\0';
    return EINVAL;
  }
  size_t n = strnlen(strSrc, count);
  if (n >= destMax) {
    strDest[0] = '\0';
    return ERANGE;
  }
  memmove(strDest, strSrc, n);
  strDest[n] = '\0';
  return EOK;
}
static inline errno_t strcpy_s(char *strDest, size_t destMax, const char *strSrc) {
  return strncpy_s(strDest, destMax, strSrc, (size_t)-1);
}
static inline errno_t strcat_s(char *strDest, size_t destMax, const char *strSrc) {
  if (strDest == NULL || destMax == 0) return EINVAL;
  size_t used = strnlen(strDest, destMax);
  if (used == destMax) return EINVAL;  // not terminated within destMax
  return strncpy_s(strDest + used, destMax - used, strSrc, (size_t)-1) == EOK ? EOK : ERANGE;
}
// Returns the number of characters written, or -1 (destination cleared) when it does not fit.
static inline int vsnprintf_s(char *strDest, size_t destMax, size_t count, const char *format, va_list ap) {
  if (strDest == NULL || destMax == 0 || format == NULL) return -1;
  size_t limit = count < destMax - 1 ? count + 1 : destMax;
  int n = vsnprintf(strDest, limit, format, ap);
  if (n < 0 || (size_t)n >= limit) {
    strDest[0] = '\0';
    return -1;
  }
  return n;
}
static inline int snprintf_s(char *strDest, size_t destMax, size_t count, const char *format, ...)
    __attribute__((format(printf, 4, 5)));
static inline int snprintf_s(char *strDest, size_t destMax, size_t count, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  int n = vsnprintf_s(strDest, destMax, count, format, ap);
  va_end(ap);
  return n;
}
static inline int sprintf_s(char *strDest, size_t destMax, const char *format, ...) __attribute__((format(printf, 3, 4)));
static inline int sprintf_s(char *strDest, size_t destMax, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  int n = vsnprintf_s(strDest, destMax, destMax - 1, format, ap);
  va_end(ap);
  return n;
}

#endif  // KVBLOCKS_SECUREC_H_
