/* CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), the
 * checksum of TFRecord files (tfevents.h), and the masked form those files
 * store. Table-driven, one byte at a time: the records it guards are a few
 * hundred bytes, written once per progress line. */
#ifndef CM_CRC32C_H
#define CM_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of len bytes at p, continuing from crc (0 to start):
 * cm_crc32c(cm_crc32c(0, a, n), b, m) is the CRC of a then b.
 * cm_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t cm_crc32c(uint32_t crc, const void *p, size_t len);

/* The masked CRC TFRecord stores, so that a CRC of data that holds CRCs is
 * not degenerate: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t cm_crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#endif
