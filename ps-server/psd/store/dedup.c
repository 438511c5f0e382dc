/* The applied-push table (dedup.h): a hash of clients with chained buckets
 * over a fixed array of entries. Each entry holds the client's newest seq
 * and a bitmap of the chunks of it applied: one inline word for the first
 * 64 chunks (every push under 128 MiB per shard), more words allocated on
 * demand. Eviction scans for the least recently used entry, which happens
 * only when a new client arrives and the table is full. The apply gate is a
 * read-write lock apart from the table's mutex: appliers hold it across
 * their claim and their apply, the mutex only across the claim. */
#include "dedup.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rand.h"

/* One remembered client. */
struct client {
  uint64_t id;    /* the client's id; 0 when the entry is free */
  uint64_t seq;   /* the newest seq seen from it */
  uint64_t used;  /* d->tick at its last claim: eviction picks the lowest */
  uint64_t word0; /* bit c: chunk c (< 64) of seq applied */
  uint64_t *more; /* owned, nmore words: chunks 64.. of seq; NULL when none */
  uint32_t nmore; /* words in more */
  int next;       /* next entry in its bucket's chain, -1 at the end */
};

struct psd_dedup {
  pthread_rwlock_t gate; /* the apply gate (dedup.h), writer-preferring */
  pthread_mutex_t lock;  /* guards everything below */
  struct client *e;      /* owned, cap entries */
  int cap;               /* entries in e */
  int used;              /* entries holding a client */
  int *bucket;           /* owned, nbuckets chain heads (-1: empty) */
  uint32_t nbuckets;     /* a power of two, at least 2 * cap */
  int free_head;         /* first free entry, chained through next */
  uint64_t tick;         /* claims so far: the clock of `used` */
  uint64_t duplicates;   /* claims that were duplicates */
  uint64_t evicted;      /* clients forgotten to make room */
};

/* Ids are chosen by clients, so mix them. */
static uint32_t hash(const struct psd_dedup *d, uint64_t id) {
  return (uint32_t)cm_mix64(id) & (d->nbuckets - 1);
}

int psd_dedup_new(struct psd_dedup **out, int capacity) {
  struct psd_dedup *d = NULL;
  pthread_rwlockattr_t attr;
  int rc = 0, attr_made = 0;

  *out = NULL;
  if (capacity < 1)
    return CM_EINVAL;
  if (!(d = calloc(1, sizeof *d)))
    return CM_ENOMEM;
  d->cap = capacity;
  d->nbuckets = 2;
  while (d->nbuckets < 2u * (uint32_t)capacity)
    d->nbuckets <<= 1;
  d->e = calloc(capacity, sizeof *d->e);
  d->bucket = malloc(d->nbuckets * sizeof *d->bucket);
  if (!d->e || !d->bucket) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (uint32_t b = 0; b < d->nbuckets; b++)
    d->bucket[b] = -1;
  for (int i = 0; i < capacity; i++)
    d->e[i].next = i + 1 < capacity ? i + 1 : -1;
  d->free_head = 0;
  /* glibc's default prefers readers: constant pushes would hold a
   * checkpoint off for ever. */
  if (pthread_rwlockattr_init(&attr) != 0) {
    rc = CM_ESYS;
    goto out;
  }
  attr_made = 1;
  if (pthread_rwlockattr_setkind_np(
          &attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP) != 0 ||
      pthread_rwlock_init(&d->gate, &attr) != 0) {
    rc = CM_ESYS;
    goto out;
  }
  pthread_mutex_init(&d->lock, NULL);
out:
  if (attr_made)
    pthread_rwlockattr_destroy(&attr);
  if (rc) {
    free(d->e);
    free(d->bucket);
    free(d);
  } else {
    *out = d;
  }
  return rc;
}

void psd_dedup_free(struct psd_dedup *d) {
  if (!d)
    return;
  for (int i = 0; i < d->cap; i++)
    free(d->e[i].more);
  free(d->e);
  free(d->bucket);
  pthread_mutex_destroy(&d->lock);
  pthread_rwlock_destroy(&d->gate);
  free(d);
}

/* The entry of client id, or -1. Caller holds the lock. */
static int find(const struct psd_dedup *d, uint64_t id) {
  for (int i = d->bucket[hash(d, id)]; i >= 0; i = d->e[i].next)
    if (d->e[i].id == id)
      return i;
  return -1;
}

/* Unlinks entry i from its bucket and puts it on the free list. */
static void drop(struct psd_dedup *d, int i) {
  int *pp = &d->bucket[hash(d, d->e[i].id)];
  while (*pp != i)
    pp = &d->e[*pp].next;
  *pp = d->e[i].next;
  free(d->e[i].more);
  memset(&d->e[i], 0, sizeof d->e[i]);
  d->e[i].next = d->free_head;
  d->free_head = i;
  d->used--;
}

/* A new entry for client id, evicting the least recently used when full. */
static int add(struct psd_dedup *d, uint64_t id) {
  int i;
  if (d->free_head < 0) {
    int lru = 0;
    for (int k = 1; k < d->cap; k++)
      if (d->e[k].used < d->e[lru].used)
        lru = k;
    drop(d, lru);
    d->evicted++;
  }
  i = d->free_head;
  d->free_head = d->e[i].next;
  d->e[i].id = id;
  d->e[i].next = d->bucket[hash(d, id)];
  d->bucket[hash(d, id)] = i;
  d->used++;
  return i;
}

/* Forgets which chunks of the entry's seq were applied. */
static void clear_chunks(struct client *c) {
  c->word0 = 0;
  if (c->more)
    memset(c->more, 0, c->nmore * sizeof *c->more);
}

/* The word holding chunk's bit, grown as needed; NULL when out of memory. */
static uint64_t *chunk_word(struct client *c, uint32_t chunk, int grow) {
  uint32_t w = chunk / 64;
  if (w == 0)
    return &c->word0;
  if (w - 1 >= c->nmore) {
    if (!grow)
      return NULL;
    uint32_t n = w; /* words 1..w */
    uint64_t *m = realloc(c->more, n * sizeof *m);
    if (!m)
      return NULL;
    memset(m + c->nmore, 0, (n - c->nmore) * sizeof *m);
    c->more = m;
    c->nmore = n;
  }
  return &c->more[w - 1];
}

int psd_dedup_claim(struct psd_dedup *d, uint64_t client, uint64_t seq,
                    uint32_t chunk) {
  int rc = 0, i;
  uint64_t *word, bit = 1ull << (chunk % 64);
  if (client == 0 || chunk >= PSD_DEDUP_MAX_CHUNKS)
    return 0;
  pthread_mutex_lock(&d->lock);
  if ((i = find(d, client)) < 0) {
    i = add(d, client);
    d->e[i].seq = seq;
  }
  struct client *c = &d->e[i];
  c->used = ++d->tick;
  if (seq < c->seq) {
    /* The client moved on only once every message of this seq was
     * acknowledged: this one is a late copy. */
    rc = 1;
  } else {
    if (seq > c->seq) {
      c->seq = seq;
      clear_chunks(c);
    }
    if (!(word = chunk_word(c, chunk, 1)))
      rc = CM_ENOMEM;
    else if (*word & bit)
      rc = 1;
    else
      *word |= bit;
  }
  if (rc == 1)
    d->duplicates++;
  pthread_mutex_unlock(&d->lock);
  return rc;
}

void psd_dedup_unclaim(struct psd_dedup *d, uint64_t client, uint64_t seq,
                       uint32_t chunk) {
  int i;
  uint64_t *word;
  if (client == 0 || chunk >= PSD_DEDUP_MAX_CHUNKS)
    return;
  pthread_mutex_lock(&d->lock);
  if ((i = find(d, client)) >= 0 && d->e[i].seq == seq &&
      (word = chunk_word(&d->e[i], chunk, 0)))
    *word &= ~(1ull << (chunk % 64));
  pthread_mutex_unlock(&d->lock);
}

void psd_dedup_stats(struct psd_dedup *d, struct psd_dedup_stats *out) {
  pthread_mutex_lock(&d->lock);
  out->duplicates = d->duplicates;
  out->clients = (uint32_t)d->used;
  out->evicted = d->evicted;
  pthread_mutex_unlock(&d->lock);
}

void psd_dedup_apply_begin(struct psd_dedup *d) {
  pthread_rwlock_rdlock(&d->gate);
}

void psd_dedup_apply_end(struct psd_dedup *d) {
  pthread_rwlock_unlock(&d->gate);
}

void psd_dedup_freeze(struct psd_dedup *d) { pthread_rwlock_wrlock(&d->gate); }

void psd_dedup_thaw(struct psd_dedup *d) { pthread_rwlock_unlock(&d->gate); }

/* ---- snapshots ---- */

/* A u64 as the 16 lowercase hex digits of a snapshot. */
static json_t *hex_new(uint64_t x) {
  char buf[17];
  snprintf(buf, sizeof buf, "%016" PRIx64, x);
  return json_string(buf);
}

/* Parses exactly 16 hex digits; returns 0 or -1. */
static int hex_get(const json_t *j, uint64_t *x) {
  const char *s = json_string_value(j);
  if (!s || strlen(s) != 16 || strspn(s, "0123456789abcdefABCDEF") != 16)
    return -1;
  *x = strtoull(s, NULL, 16);
  return 0;
}

/* Orders entry indices by their last claim, oldest first (qsort_r; arg is
 * the entries). */
static int cmp_used(const void *a, const void *b, void *arg) {
  const struct client *e = arg;
  uint64_t x = e[*(const int *)a].used, y = e[*(const int *)b].used;
  return x < y ? -1 : x > y;
}

/* One entry as {"client", "seq", "chunks"}; NULL when out of memory. */
static json_t *entry_json(const struct client *c) {
  json_t *chunks = json_array(), *e;
  uint32_t nwords = 1 + c->nmore;
  /* Trailing zero words say nothing. */
  while (nwords > 0 && (nwords == 1 ? c->word0 : c->more[nwords - 2]) == 0)
    nwords--;
  for (uint32_t w = 0; chunks && w < nwords; w++)
    if (json_array_append_new(chunks,
                              hex_new(w == 0 ? c->word0 : c->more[w - 1]))) {
      json_decref(chunks);
      chunks = NULL;
    }
  if (!chunks)
    return NULL;
  /* "o" takes chunks' reference even when packing fails. */
  e = json_pack("{s:o, s:o, s:o}", "client", hex_new(c->id), "seq",
                hex_new(c->seq), "chunks", chunks);
  return e;
}

int psd_dedup_save(struct psd_dedup *d, json_t **out) {
  json_t *a = json_array();
  int *order = NULL, n = 0, rc = 0;

  *out = NULL;
  pthread_mutex_lock(&d->lock);
  if (!a || !(order = malloc((size_t)d->cap * sizeof *order))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < d->cap; i++)
    if (d->e[i].id)
      order[n++] = i;
  /* The order lets a load rebuild the eviction order. */
  qsort_r(order, n, sizeof *order, cmp_used, d->e);
  for (int k = 0; k < n; k++) {
    if (json_array_append_new(a, entry_json(&d->e[order[k]]))) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
out:
  pthread_mutex_unlock(&d->lock);
  free(order);
  if (rc)
    json_decref(a);
  else
    *out = a;
  return rc;
}

/* Loads one snapshot entry, e (dedup[k]). Caller holds the lock. */
static int load_entry(struct psd_dedup *d, const json_t *e, size_t k, char *err,
                      size_t errlen) {
  const json_t *chunks = json_object_get(e, "chunks"), *w;
  uint64_t id, seq, word;
  size_t nw, j;
  int i;

  if (!json_is_object(e) || json_object_size(e) != 3 ||
      !json_object_get(e, "client") || !json_object_get(e, "seq") || !chunks) {
    snprintf(err, errlen,
             "dedup[%zu]: not an object of exactly \"client\", \"seq\" "
             "and \"chunks\"",
             k);
    return CM_EFORMAT;
  }
  if (hex_get(json_object_get(e, "client"), &id) || id == 0) {
    snprintf(err, errlen,
             "dedup[%zu].client: not 16 hex digits naming a client (not 0)", k);
    return CM_EFORMAT;
  }
  if (hex_get(json_object_get(e, "seq"), &seq)) {
    snprintf(err, errlen, "dedup[%zu].seq: not 16 hex digits", k);
    return CM_EFORMAT;
  }
  nw = json_array_size(chunks);
  if (!json_is_array(chunks) || nw > PSD_DEDUP_MAX_CHUNKS / 64) {
    snprintf(err, errlen, "dedup[%zu].chunks: not an array of at most %d words",
             k, PSD_DEDUP_MAX_CHUNKS / 64);
    return CM_EFORMAT;
  }
  if (find(d, id) >= 0) {
    snprintf(err, errlen, "dedup[%zu].client: %016" PRIx64 " is there twice", k,
             id);
    return CM_EFORMAT;
  }
  i = add(d, id);
  d->e[i].seq = seq;
  d->e[i].used = ++d->tick;
  json_array_foreach(chunks, j, w) {
    uint64_t *slot;
    if (hex_get(w, &word)) {
      snprintf(err, errlen, "dedup[%zu].chunks[%zu]: not 16 hex digits", k, j);
      return CM_EFORMAT;
    }
    if (!word)
      continue;
    if (!(slot = chunk_word(&d->e[i], (uint32_t)j * 64, 1)))
      return CM_ENOMEM;
    *slot = word;
  }
  return 0;
}

int psd_dedup_load(struct psd_dedup *d, const json_t *snap, char *err,
                   size_t errlen) {
  const json_t *e;
  size_t k;
  int rc = 0;

  if (!json_is_array(snap)) {
    snprintf(err, errlen, "dedup: not an array");
    return CM_EFORMAT;
  }
  pthread_mutex_lock(&d->lock);
  json_array_foreach(snap, k, e) {
    if ((rc = load_entry(d, e, k, err, errlen)))
      break;
  }
  pthread_mutex_unlock(&d->lock);
  if (rc == CM_ENOMEM)
    snprintf(err, errlen, "dedup: out of memory");
  return rc;
}
