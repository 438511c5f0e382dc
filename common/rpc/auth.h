/* Who may talk to psd: the bearer token and TLS material named by the
 * spec's "auth" object, loaded for one role (a shard, or a client: dworker,
 * psctl), and the token check itself.
 *
 * The token travels as gRPC metadata "authorization: Bearer <token>" on
 * every call, admin calls included; a shard compares it in constant time.
 * With TLS the shards present auth.tls.cert and clients check it against
 * auth.tls.ca; with auth.tls.mutual the shards also demand a client
 * certificate signed by that CA. */
#ifndef CM_AUTH_H
#define CM_AUTH_H

#include <stddef.h>

#include "spec.h"

/* Longest token accepted, in bytes. */
#define CM_TOKEN_MAX 4096

/* What one process needs to authenticate, loaded from the files the spec
 * names. Owns its PEM strings; free with cm_creds_free. */
struct cm_creds {
  char token[CM_TOKEN_MAX + 1]; /* the bearer token, "" when none */
  int tls;                      /* 1: TLS on every TCP connection */
  char *ca_pem;          /* the CA bundle (clients: to check shards; shards with
                            mutual: to check clients), or NULL */
  char *cert_pem;        /* own certificate chain (shard; client with mutual) */
  char *key_pem;         /* its private key */
  int mutual;            /* shards require a client certificate */
  char server_name[256]; /* clients: the name to expect in the shard's
                            certificate instead of its host, "" when none */
};

/* Loads what `server` (1: a shard, 0: a client) needs from a->*: the token
 * file, and with TLS the PEM files of that role. Every failure names the
 * spec key and the file ("auth.token_file: cannot read /etc/psd/token: No
 * such file or directory"). Returns 0, CM_ENOENT/CM_EIO for a file that
 * cannot be read, CM_EINVAL for an empty, oversized or malformed one, or
 * CM_ENOMEM. *out is zeroed first and holds nothing on failure. */
int cm_creds_load(const struct cm_auth *a, int server, struct cm_creds *out,
                  char *err, size_t errlen);

void cm_creds_free(struct cm_creds *c);

/* 1 when the metadata value `got` (glen bytes, not terminated) is "Bearer "
 * followed by exactly `token`; compares in time that depends only on the
 * lengths, never on where the bytes differ. */
int cm_auth_bearer_ok(const char *token, const char *got, size_t glen);

#endif
