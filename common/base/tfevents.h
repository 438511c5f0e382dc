/* TensorBoard event files: a writer of scalar summaries that TensorBoard
 * (or tf.data.TFRecordDataset with tf.compat.v1.Event) reads, with no
 * TensorFlow or protobuf library behind it.
 *
 * The file is a TFRecord stream: each record is its length (uint64 little
 * endian), the masked CRC-32C of those 8 bytes, the data, and the masked
 * CRC-32C of the data (crc32c.h). Each record's data is an Event message
 * (tensorflow/core/util/event.proto), hand-encoded here from its public
 * field numbers:
 *
 *   Event          wall_time = 1 (double), step = 2 (int64),
 *                  file_version = 3 (string), summary = 5 (Summary)
 *   Summary        value = 1 (repeated Summary.Value)
 *   Summary.Value  tag = 1 (string), simple_value = 2 (float)
 *
 * The first record is the event whose file_version is "brain.Event:2";
 * each later one holds the scalars of one step. Every record is flushed
 * to the kernel as it is written, so a crash loses nothing written. */
#ifndef CM_TFEVENTS_H
#define CM_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

/* The file_version of the first record. */
#define CM_TFEVENTS_VERSION "brain.Event:2"

/* Bytes before and after a record's data. */
#define CM_TFRECORD_HEAD 12
#define CM_TFRECORD_FOOT 4

/* Longest tag, in bytes. */
#define CM_TFEVENTS_MAX_TAG 128

/* An open event file; made by cm_tfevents_open, freed by
 * cm_tfevents_close. */
struct cm_tfevents;

/* One scalar of an event. */
struct cm_tf_scalar {
  const char *tag; /* e.g. "train/loss", at most CM_TFEVENTS_MAX_TAG bytes;
                      borrowed for the call */
  float value;     /* its value at the event's step */
};

/* Fills head with a record's first 12 bytes: len (uint64 little endian)
 * and the masked CRC-32C of those 8 bytes. */
void cm_tfrecord_head(unsigned char head[CM_TFRECORD_HEAD], uint64_t len);

/* Fills foot with the masked CRC-32C of the record's len bytes of data. */
void cm_tfrecord_foot(unsigned char foot[CM_TFRECORD_FOOT], const void *data,
                      size_t len);

/* Encodes an Event into buf[0..cap): wall_time; step unless 0; the
 * file_version when version is not NULL; and a Summary of the n scalars
 * when n > 0. Returns the bytes used, or CM_ERANGE when cap is too small
 * or a tag too long. */
int cm_tfevents_encode(unsigned char *buf, size_t cap, double wall_time,
                       int64_t step, const char *version,
                       const struct cm_tf_scalar *v, int n);

/* Creates dir (and its parents) when missing, then the file
 * dir/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<index>, and
 * writes the file_version record. *out is the caller's to close. Returns
 * 0, or CM_EIO, CM_ERANGE (a path too long) or CM_ENOMEM, with *out NULL
 * and errno as the failing call left it. */
int cm_tfevents_open(struct cm_tfevents **out, const char *dir, int index);

/* The file's path (owned by w). */
const char *cm_tfevents_path(const struct cm_tfevents *w);

/* Writes one event at this step, now, holding the n scalars, and flushes
 * it. Returns 0, or CM_ERANGE (too many or too long tags) or CM_EIO. */
int cm_tfevents_write(struct cm_tfevents *w, int64_t step,
                      const struct cm_tf_scalar *v, int n);

/* Closes the file and frees w (NULL is fine). Returns 0, or CM_EIO when
 * the last flush failed. */
int cm_tfevents_close(struct cm_tfevents *w);

#endif
