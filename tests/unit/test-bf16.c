/* bfloat16 conversions (common/base/bf16.h): values bfloat16 represents
 * survive the round trip exactly; every other float rounds to the nearer
 * of its two bfloat16 neighbours, ties to the even one, checked against a
 * plain reference loop in double precision over random bit patterns of
 * every exponent; NaN stays NaN, infinities and signed zeros stay. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "rand.h"
#include "unit.h"

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* The value of a bfloat16's upper bits as a double; the pattern one past
 * the largest finite (the infinity's) counts as 2^128, where IEEE rounding
 * puts it when deciding between the largest finite and infinity. */
static double bf_value(uint32_t hi16) {
  uint32_t mag = hi16 & 0x7fffu;
  double v = mag == 0x7f80u ? ldexp(1.0, 128) : (double)from_bits(mag << 16);
  return hi16 & 0x8000u ? -v : v;
}

/* The reference: the nearer neighbour, the even one on a tie. */
static uint16_t reference(float x) {
  uint32_t u = to_bits(x), lo = u >> 16, hi = lo + 1;
  double dl = fabs((double)x - bf_value(lo)), dh = fabs(bf_value(hi) - x);
  if (dl < dh)
    return (uint16_t)lo;
  if (dh < dl)
    return (uint16_t)hi;
  return (uint16_t)(lo & 1u ? hi : lo);
}

START_TEST(representable_values_are_exact) {
  float src[4096], back[4096];
  uint16_t wire[4096];
  uint64_t state = 7;
  for (int i = 0; i < 4096; i++) {
    uint32_t u = (uint32_t)cm_splitmix64(&state) & 0xffff0000u;
    if ((u & 0x7f800000u) == 0x7f800000u)
      u &= 0xbfffffffu; /* keep NaN and infinity out here */
    src[i] = from_bits(u);
  }
  cm_bf16_from_f32(wire, src, 4096);
  cm_bf16_to_f32(back, wire, 4096);
  ck_assert_mem_eq(back, src, sizeof src);
}
END_TEST

START_TEST(rounding_is_nearest_ties_to_even) {
  enum { N = 1 << 16 };
  float *src = malloc(N * sizeof *src);
  uint16_t *wire = malloc(N * sizeof *wire);
  uint64_t state = 11;
  int ties = 0;
  for (int i = 0; i < N; i++) {
    uint32_t u = (uint32_t)cm_splitmix64(&state);
    if (i % 8 == 0) /* exact ties, odd and even neighbours alike */
      u = (u & 0xffff0000u) | 0x8000u;
    if ((u & 0x7f800000u) == 0x7f800000u)
      u &= 0xbfffffffu;
    src[i] = from_bits(u);
  }
  cm_bf16_from_f32(wire, src, N);
  for (int i = 0; i < N; i++) {
    ties += (to_bits(src[i]) & 0xffffu) == 0x8000u;
    ck_assert_msg(wire[i] == reference(src[i]),
                  "%a (0x%08x): 0x%04x, reference 0x%04x", (double)src[i],
                  to_bits(src[i]), wire[i], reference(src[i]));
  }
  ck_assert_int_ge(ties, N / 8);
  free(src);
  free(wire);
}
END_TEST

START_TEST(special_values) {
  float src[] = {0.0f,
                 -0.0f,
                 INFINITY,
                 -INFINITY,
                 NAN,
                 -NAN,
                 from_bits(0x7f800001u), /* signalling NaN: low bits only */
                 from_bits(0x7f7fffffu), /* largest float: rounds to inf */
                 from_bits(0x7f7f7fffu), /* just below the halfway point */
                 from_bits(0x00000001u), /* smallest subnormal: to zero */
                 1.0f,
                 -3.0f};
  enum { N = sizeof src / sizeof src[0] };
  uint16_t wire[N];
  float back[N];
  cm_bf16_from_f32(wire, src, N);
  cm_bf16_to_f32(back, wire, N);
  ck_assert_uint_eq(to_bits(back[0]), 0u);
  ck_assert_uint_eq(to_bits(back[1]), 0x80000000u);
  ck_assert(isinf(back[2]) && back[2] > 0);
  ck_assert(isinf(back[3]) && back[3] < 0);
  ck_assert(isnan(back[4]));
  ck_assert(isnan(back[5]) && signbit(back[5]));
  ck_assert(isnan(back[6]));
  ck_assert(isinf(back[7]) && back[7] > 0);
  ck_assert_uint_eq(to_bits(back[8]), 0x7f7f0000u);
  ck_assert_uint_eq(to_bits(back[9]), 0u);
  ck_assert(back[10] == 1.0f && back[11] == -3.0f);
}
END_TEST

/* Received slices start anywhere: widening reads any alignment. */
START_TEST(unaligned_source) {
  float src[33], back[33];
  uint16_t wire[33];
  uint8_t raw[2 * 33 + 1];
  for (int i = 0; i < 33; i++)
    src[i] = (float)i - 16.0f;
  cm_bf16_from_f32(wire, src, 33);
  memcpy(raw + 1, wire, sizeof wire);
  cm_bf16_to_f32(back, raw + 1, 33);
  ck_assert_mem_eq(back, src, sizeof src);
}
END_TEST

static Suite *bf16_suite(void) {
  Suite *s = suite_create("bf16");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, representable_values_are_exact);
  tcase_add_test(tc, rounding_is_nearest_ties_to_even);
  tcase_add_test(tc, special_values);
  tcase_add_test(tc, unaligned_source);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(bf16_suite(), 0); }
