/* Loading the spec's credentials and checking a bearer token (auth.h). */
#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "err.h"
#include "log.h"

/* Largest PEM file read: certificate chains and keys are a few KiB. */
#define PEM_MAX (1 << 20)

/* Reads the file at path (named by the spec key `key`) into a new string.
 * Returns 0 or a negative code with err set. */
static int read_file(const char *key, const char *path, size_t max, char **out,
                     size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t n = 0;
  int rc = 0;

  *out = NULL;
  if (!f) {
    snprintf(err, errlen, "%s: cannot read %s: %s", key, path, strerror(errno));
    return errno == ENOENT ? CM_ENOENT : CM_EIO;
  }
  if (!(buf = malloc(max + 2))) {
    rc = CM_ENOMEM;
    goto out;
  }
  n = fread(buf, 1, max + 1, f);
  if (ferror(f)) {
    snprintf(err, errlen, "%s: cannot read %s: %s", key, path, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  if (n > max) {
    snprintf(err, errlen, "%s: %s is larger than %zu bytes; expected %s", key,
             path, max, max == CM_TOKEN_MAX ? "a token" : "a PEM file");
    rc = CM_EINVAL;
    goto out;
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
out:
  fclose(f);
  if (rc)
    free(buf);
  return rc;
}

/* Reads the token: the file's first line, surrounding blanks removed. */
static int load_token(const char *path, char *token, char *err, size_t errlen) {
  char *text = NULL, *p, *end;
  size_t len = 0;
  struct stat st;
  int rc;

  if ((rc = read_file("auth.token_file", path, CM_TOKEN_MAX, &text, &len, err,
                      errlen)))
    return rc;
  for (p = text; *p == ' ' || *p == '\t'; p++)
    ;
  end = p + strcspn(p, "\r\n");
  while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
    end--;
  if (end == p) {
    snprintf(err, errlen,
             "auth.token_file: %s is empty; expected the token on its first "
             "line (e.g. from: head -c 32 /dev/urandom | base64)",
             path);
    free(text);
    return CM_EINVAL;
  }
  for (const char *q = p; q < end; q++)
    if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e) {
      snprintf(err, errlen,
               "auth.token_file: %s: the token has a character that cannot "
               "travel in a gRPC header (byte %d); expected printable ASCII",
               path, (int)(q - text) + 1);
      free(text);
      return CM_EINVAL;
    }
  memcpy(token, p, (size_t)(end - p));
  token[end - p] = 0;
  free(text);
  /* Group-readable is how a root-owned file reaches the psd user (mode
   * 640, group psd); readable by everyone is a leak. */
  if (!stat(path, &st) && (st.st_mode & 007))
    cm_warn("auth.token_file: %s can be read by every user (mode %04o); "
            "chmod 600 it (or 640 with the daemons' group)",
            path, (unsigned)(st.st_mode & 07777));
  return 0;
}

/* Reads one PEM file named by the spec key `key`; "" paths are an error
 * naming what the role needs. */
static int load_pem(const char *key, const char *path, const char *why,
                    char **out, char *err, size_t errlen) {
  size_t len;
  int rc;
  if (!path[0]) {
    snprintf(err, errlen, "%s: not set; %s", key, why);
    return CM_EINVAL;
  }
  if ((rc = read_file(key, path, PEM_MAX, out, &len, err, errlen)))
    return rc;
  if (!strstr(*out, "-----BEGIN ")) {
    snprintf(err, errlen, "%s: %s is not a PEM file (no -----BEGIN line)", key,
             path);
    free(*out);
    *out = NULL;
    return CM_EINVAL;
  }
  return 0;
}

int cm_creds_load(const struct cm_auth *a, int server, struct cm_creds *out,
                  char *err, size_t errlen) {
  int rc = 0;

  memset(out, 0, sizeof *out);
  if (a->token_file[0] &&
      (rc = load_token(a->token_file, out->token, err, errlen)))
    goto out;
  if (!a->tls)
    return 0;
  out->tls = 1;
  out->mutual = a->mutual;
  snprintf(out->server_name, sizeof out->server_name, "%s", a->server_name);
  if (server) {
    if ((rc =
             load_pem("auth.tls.cert", a->cert, "a shard needs its certificate",
                      &out->cert_pem, err, errlen)) ||
        (rc = load_pem("auth.tls.key", a->key, "a shard needs its private key",
                       &out->key_pem, err, errlen)))
      goto out;
    if (a->mutual &&
        (rc = load_pem("auth.tls.ca", a->ca,
                       "with mutual TLS a shard checks client certificates "
                       "against it",
                       &out->ca_pem, err, errlen)))
      goto out;
  } else {
    if ((rc = load_pem("auth.tls.ca", a->ca,
                       "a client checks the shards' certificates against it",
                       &out->ca_pem, err, errlen)))
      goto out;
    if (a->mutual &&
        ((rc = load_pem("auth.tls.client_cert", a->client_cert,
                        "with mutual TLS a client presents a certificate",
                        &out->cert_pem, err, errlen)) ||
         (rc = load_pem("auth.tls.client_key", a->client_key,
                        "with mutual TLS a client needs its private key",
                        &out->key_pem, err, errlen))))
      goto out;
  }
out:
  if (rc)
    cm_creds_free(out);
  return rc;
}

void cm_creds_free(struct cm_creds *c) {
  if (!c)
    return;
  free(c->ca_pem);
  free(c->cert_pem);
  free(c->key_pem);
  memset(c, 0, sizeof *c);
}

int cm_auth_bearer_ok(const char *token, const char *got, size_t glen) {
  static const char prefix[] = "Bearer ";
  size_t plen = sizeof prefix - 1, tlen = strlen(token);
  unsigned char diff = 0;

  if (glen != plen + tlen)
    return 0;
  for (size_t i = 0; i < glen; i++)
    diff |= (unsigned char)got[i] ^
            (unsigned char)(i < plen ? prefix[i] : token[i - plen]);
  return diff == 0;
}
