/* Safetensors files (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON header, then the tensors'
 * bytes back to back. The header maps each tensor's name to
 *   {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}
 * (offsets relative to the first byte after the header) and may hold a
 * "__metadata__" object of string to string. numpy (a few lines) and
 * PyTorch (safetensors.torch.load_file) read them.
 *
 * The writer streams: it writes the header from the tensors' names and
 * shapes, then takes their bytes in order, checksumming each tensor (CRC-32,
 * zlib's) as it goes, so a tensor never has to be copied whole. The reader
 * checks everything a header claims against the file before anything is
 * read: a truncated or garbage file is an error with a message (CM_ETRUNC,
 * CM_EFORMAT), never a crash or a read out of bounds. */
#ifndef CM_SAFETENSORS_H
#define CM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Dimensions a tensor may have. */
#define CM_ST_MAX_DIMS 8
/* Largest header the reader accepts (the reference implementation's limit). */
#define CM_ST_MAX_HEADER (100u << 20)

/* One tensor as a header describes it. */
struct cm_st_tensor {
  char *name;                    /* owned by the file that holds it */
  char dtype[16];                /* "F32", "F16", "I64", ... */
  int ndim;                      /* 0..CM_ST_MAX_DIMS (0: a scalar) */
  int64_t shape[CM_ST_MAX_DIMS]; /* the first ndim entries */
  uint64_t begin, end;           /* byte range within the data section */
};

/* One "__metadata__" entry (both strings borrowed). */
struct cm_st_meta {
  const char *key;   /* UTF-8 */
  const char *value; /* UTF-8 */
};

/* A tensor to write: values of this shape and dtype (strings borrowed). */
struct cm_st_desc {
  const char *name;     /* UTF-8, unique in the file, not "__metadata__" */
  int ndim;             /* 0..CM_ST_MAX_DIMS */
  const int64_t *shape; /* ndim entries >= 0 */
  const char *dtype;    /* writer: NULL or "F32" (4 bytes), or "U64" (8) */
};

/* CRC-32 (zlib's polynomial) of p[0..n) continued from crc; start with 0. */
uint32_t cm_st_crc32(uint32_t crc, const void *p, size_t n);

/* ---- writer ---- */

struct cm_st_writer;

/* Writes the header for tensors[0..n) (F32 or U64, in this order) and
 * meta[0..nmeta) to fd at its current position and returns a writer for their
 * bytes. fd stays the caller's (the writer neither fsyncs nor closes it); path
 * names it in messages. Returns 0, CM_EINVAL for a bad name, shape or dtype
 * (err says which), CM_EIO for a failed write (err has strerror), CM_ENOMEM. */
int cm_st_writer_new(struct cm_st_writer **out, int fd, const char *path,
                     const struct cm_st_desc *tensors, int n,
                     const struct cm_st_meta *meta, int nmeta, char *err,
                     size_t errlen);

/* Appends len bytes of tensor data (the tensors' bytes in order; one call may
 * span tensors or cover part of one). CM_EINVAL when that is more than the
 * header announced, CM_EIO for a failed write. */
int cm_st_writer_write(struct cm_st_writer *w, const void *data, size_t len,
                       char *err, size_t errlen);

/* Checks that every tensor's bytes were written. CM_EINVAL if not. */
int cm_st_writer_finish(struct cm_st_writer *w, char *err, size_t errlen);

/* CRC-32 of tensor i's bytes as written (complete after finish). */
uint32_t cm_st_writer_crc(const struct cm_st_writer *w, int i);

/* Bytes of the whole file: length prefix, header and data. */
uint64_t cm_st_writer_size(const struct cm_st_writer *w);

void cm_st_writer_free(struct cm_st_writer *w);

/* ---- reader ---- */

struct cm_st_file;

/* Opens path and validates its header: length, JSON, every tensor's dtype,
 * shape and offsets (in bounds, contiguous, covering the data section
 * exactly) and the metadata. Returns 0; CM_ENOENT or CM_EIO when it cannot be
 * read, CM_ETRUNC when it is shorter than its header says, CM_EFORMAT for
 * anything else wrong; err names the file and the problem. */
int cm_st_open(struct cm_st_file **out, const char *path, char *err,
               size_t errlen);
void cm_st_close(struct cm_st_file *f);

/* Tensors, in the order of their data. */
int cm_st_count(const struct cm_st_file *f);
const struct cm_st_tensor *cm_st_at(const struct cm_st_file *f, int i);

/* The tensor called name, or NULL. */
const struct cm_st_tensor *cm_st_find(const struct cm_st_file *f,
                                      const char *name);

/* The metadata value for key (owned by f), or NULL. */
const char *cm_st_meta_get(const struct cm_st_file *f, const char *key);

/* Reads len bytes of t's data from byte off of it into buf. CM_ERANGE when
 * that is not within t, CM_EIO/CM_ETRUNC when the read fails or comes up
 * short (the file changed under us). */
int cm_st_read(struct cm_st_file *f, const struct cm_st_tensor *t, uint64_t off,
               void *buf, size_t len, char *err, size_t errlen);

/* Size of the whole file in bytes, as checked by cm_st_open. */
uint64_t cm_st_size(const struct cm_st_file *f);

#endif
