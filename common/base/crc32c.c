/* CRC-32C (crc32c.h): the reflected Castagnoli polynomial over a 256-entry
 * table built once on first use (under pthread_once, since any thread may
 * be first). */
#include "crc32c.h"

#include <pthread.h>

/* The reflected polynomial 0x1EDC6F41. */
#define CRC32C_POLY 0x82f63b78u

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

/* Fills table[b]: the CRC of the one byte b, shifted out bit by bit. */
static void build_table(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++)
      c = c & 1u ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    table[b] = c;
  }
}

uint32_t cm_crc32c(uint32_t crc, const void *p, size_t len) {
  const unsigned char *b = p;

  pthread_once(&table_once, build_table);
  crc = ~crc;
  for (size_t i = 0; i < len; i++)
    crc = table[(crc ^ b[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}
