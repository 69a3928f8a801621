/* modp.h: exact arithmetic in Z_p, p = 2^31 - 1 (a Mersenne prime).
 *
 * Residues are uint32_t in [0, p). A product of two residues is below 2^62,
 * so it fits uint64_t and reduces with two shift-and-add folds instead of a
 * division: 2^31 = 1 (mod p). A uint64_t holds 4 unreduced products, or
 * 2^33 products that were each reduced first; dot products in the Z_p
 * kernels accumulate one of these two ways.
 * Fingerprints (gen-rules) and PET's random tests evaluate graphs here, so
 * nothing overflows and equal results are equal exactly. */
#ifndef TEQ_RUNTIME_MODP_H
#define TEQ_RUNTIME_MODP_H

#include <stdint.h>

#define MODP_P 2147483647u /* 2^31 - 1 */

/* Any uint64_t to [0, p). */
static inline uint32_t modp_reduce(uint64_t x) {
  x = (x & MODP_P) + (x >> 31); /* < 2^33 + 2^31 */
  x = (x & MODP_P) + (x >> 31); /* <= p + 4 */
  return (uint32_t)(x >= MODP_P ? x - MODP_P : x);
}

static inline uint32_t modp_add(uint32_t a, uint32_t b) {
  uint32_t s = a + b; /* < 2^32: no wrap */
  return s >= MODP_P ? s - MODP_P : s;
}

static inline uint32_t modp_sub(uint32_t a, uint32_t b) {
  return a >= b ? a - b : a + (MODP_P - b);
}

static inline uint32_t modp_neg(uint32_t a) { return a ? MODP_P - a : 0; }

static inline uint32_t modp_mul(uint32_t a, uint32_t b) {
  return modp_reduce((uint64_t)a * b);
}

/* A signed integer into Z_p (negative values wrap to p - |x|). */
static inline uint32_t modp_from_int(int64_t x) {
  int64_t r = x % (int64_t)MODP_P;
  return (uint32_t)(r < 0 ? r + (int64_t)MODP_P : r);
}

/* The residue as the integer of least absolute value, in (-p/2, p/2]. */
static inline int64_t modp_to_int(uint32_t a) {
  return a > MODP_P / 2 ? (int64_t)a - (int64_t)MODP_P : (int64_t)a;
}

static inline uint32_t modp_pow(uint32_t a, uint64_t e) {
  uint32_t r = 1;
  while (e) {
    if (e & 1) r = modp_mul(r, a);
    a = modp_mul(a, a);
    e >>= 1;
  }
  return r;
}

/* Inverse by Fermat: a^(p-2). modp_inv(0) is 0, a convention the Z_p
 * kernels document where they divide. */
static inline uint32_t modp_inv(uint32_t a) { return modp_pow(a, MODP_P - 2); }

/* c3 x^3 + c2 x^2 + c1 x + c0, by Horner: the shape of the registry's
 * stand-ins for non-linear operators. Distinct cubics agree on at most 3
 * points, so fingerprints tell the operators apart. */
static inline uint32_t modp_poly3(uint32_t x, uint32_t c3, uint32_t c2, uint32_t c1, uint32_t c0) {
  uint32_t r = modp_add(modp_mul(c3, x), c2);
  r = modp_add(modp_mul(r, x), c1);
  return modp_add(modp_mul(r, x), c0);
}

#endif
