/* test_modp.c: Z_p arithmetic against 128-bit reference arithmetic, at the
 * edges (0, 1, p-1, products near 2^62, sums near 2^64) and at random. */
#include "runtime/modp.h"

#include "runtime/tensor.h"
#include "tests/check.h"

static uint32_t ref_mul(uint32_t a, uint32_t b) {
  return (uint32_t)(((unsigned __int128)a * b) % MODP_P);
}

static void test_edges(void) {
  const uint32_t pm1 = MODP_P - 1;
  CHECK_EQ_INT(modp_add(0, 0), 0);
  CHECK_EQ_INT(modp_add(pm1, 1), 0);
  CHECK_EQ_INT(modp_add(pm1, pm1), MODP_P - 2);
  CHECK_EQ_INT(modp_sub(0, 1), pm1);
  CHECK_EQ_INT(modp_sub(5, 5), 0);
  CHECK_EQ_INT(modp_neg(0), 0);
  CHECK_EQ_INT(modp_neg(1), pm1);
  CHECK_EQ_INT(modp_mul(pm1, pm1), 1);   /* (-1)^2 */
  CHECK_EQ_INT(modp_mul(pm1, 2), MODP_P - 2);
  CHECK_EQ_INT(modp_mul(0, pm1), 0);
  CHECK_EQ_INT(modp_mul(1, pm1), pm1);
  /* The largest product of residues, (p-1)^2, is just under 2^62. */
  CHECK_EQ_INT(modp_reduce((uint64_t)pm1 * pm1), 1);
  CHECK_EQ_INT(modp_reduce(UINT64_MAX), (uint32_t)(UINT64_MAX % MODP_P));
  CHECK_EQ_INT(modp_reduce(MODP_P), 0);
  CHECK_EQ_INT(modp_reduce((uint64_t)MODP_P * 4), 0);
  CHECK_EQ_INT(modp_reduce((uint64_t)1 << 62), (uint32_t)(((uint64_t)1 << 62) % MODP_P));
  CHECK_EQ_INT(modp_from_int(-1), pm1);
  CHECK_EQ_INT(modp_from_int(-(int64_t)MODP_P), 0);
  CHECK_EQ_INT(modp_from_int(INT64_MIN), (uint32_t)(MODP_P - (uint32_t)(((uint64_t)1 << 63) % MODP_P)));
  CHECK_EQ_INT(modp_to_int(pm1), -1);
  CHECK_EQ_INT(modp_to_int(3), 3);
  CHECK_EQ_INT(modp_inv(1), 1);
  CHECK_EQ_INT(modp_inv(0), 0);
  CHECK_EQ_INT(modp_mul(modp_inv(9), 9), 1);
  CHECK_EQ_INT(modp_pow(2, 31), 1); /* 2^31 = p + 1 */
  CHECK_EQ_INT(modp_pow(7, MODP_P - 1), 1); /* Fermat */
}

static void test_random(void) {
  uint64_t st = 12345;
  int bad_mul = 0, bad_inv = 0, bad_add = 0, bad_sum = 0;
  for (int i = 0; i < 200000; i++) {
    uint32_t a = modp_reduce(rng_next(&st)), b = modp_reduce(rng_next(&st));
    if (modp_mul(a, b) != ref_mul(a, b)) bad_mul++;
    if (modp_add(a, b) != (uint32_t)(((uint64_t)a + b) % MODP_P)) bad_add++;
    if (a && modp_mul(modp_inv(a), a) != 1) bad_inv++;
    /* A dot product of 4 terms accumulated unreduced, as kernels do. */
    uint64_t acc = 0;
    unsigned __int128 ref = 0;
    for (int k = 0; k < 4; k++) {
      uint32_t x = modp_reduce(rng_next(&st)), y = modp_reduce(rng_next(&st));
      acc += (uint64_t)x * y;
      ref += (unsigned __int128)x * y;
    }
    if (modp_reduce(acc) != (uint32_t)(ref % MODP_P)) bad_sum++;
  }
  CHECK_EQ_INT(bad_mul, 0);
  CHECK_EQ_INT(bad_add, 0);
  CHECK_EQ_INT(bad_inv, 0);
  CHECK_EQ_INT(bad_sum, 0);
}

int main(void) {
  test_edges();
  test_random();
  return check_exit();
}
