/* Variants of an encoded protobuf message for tests of bad input
 * (test-service-empty.c): from a valid request, every field absent in turn;
 * every string, bytes, message or packed field present but empty; inside
 * every message a field holds (each element of a repeated one), each of its
 * fields absent or empty; and every field but `caller` absent. Made on the
 * wire format from the message's descriptor, so a field added to the proto
 * is taken apart without a change to the test. Check's assertions report a
 * message this cannot read. */
#ifndef TESTS_PBVARIANTS_H
#define TESTS_PBVARIANTS_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* An encoded message being built. */
struct tu_buf {
  uint8_t *p; /* bytes (owned) */
  size_t n;   /* used */
  size_t cap; /* allocated */
};

/* Appends p[0..n) to b, growing it. */
void tu_put(struct tu_buf *b, const void *p, size_t n);

/* Most variants of one request. */
#define TU_MAX_VARIANTS 512

/* A request with one field taken away or emptied. */
struct tu_variant {
  char what[160];    /* "caller.job absent", "vars[1].shape empty" */
  int keep;          /* every field but caller absent: the emptiest request
                        that names its caller, which should change nothing */
  struct tu_buf msg; /* the encoded request (owned) */
};

/* The variants of one request. */
struct tu_variants {
  struct tu_variant v[TU_MAX_VARIANTS]; /* v[0..n) */
  int n;                                /* used */
};

/* Appends to vs every variant of the message p[0..n) of type d. */
void tu_take_apart(struct tu_variants *vs, const uint8_t *p, size_t n,
                   const ProtobufCMessageDescriptor *d);

/* Frees the variants' messages and empties vs. */
void tu_variants_release(struct tu_variants *vs);

#endif
