#!/bin/sh
# Prints the Secret psd-auth that the manifests mount at /etc/psd-auth, as
# YAML on stdout: a bearer token (token), a CA made for this job (ca.crt),
# and the shards' certificate and key signed by it (tls.crt, tls.key),
# naming "psd" (the ConfigMap's auth.tls.server_name) so that one
# certificate serves every shard in any namespace. The CA's key is thrown
# away: to renew, make a new Secret and restart the job.
#
#   sh deploy/k8s/make-secret.sh > psd-auth.yaml
#   kubectl -n ml apply -f psd-auth.yaml && rm psd-auth.yaml
#
# usage: make-secret.sh [NAME [SERVER_NAME]]   (default psd-auth, psd)
set -eu

name=${1:-psd-auth}
server=${2:-psd}
if ! command -v openssl >/dev/null; then
  echo "make-secret.sh: openssl is not installed" >&2
  exit 1
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
umask 077
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
head -c 32 /dev/urandom | base64 >"$d/token"
# shellcheck disable=SC2086 # $ec is several words on purpose
openssl req -x509 $ec -keyout "$d/ca.key" -out "$d/ca.crt" -days 3650 \
  -subj "/CN=psd job CA" 2>/dev/null
# shellcheck disable=SC2086
openssl req $ec -keyout "$d/tls.key" -out "$d/tls.csr" \
  -subj "/CN=$server" 2>/dev/null
printf 'subjectAltName=DNS:%s\n' "$server" >"$d/san.ext"
openssl x509 -req -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
  -CAcreateserial -out "$d/tls.crt" -days 825 -extfile "$d/san.ext" 2>/dev/null

cat <<EOF
# The Secret of psd's job (deploy/k8s/make-secret.sh): its token, its CA,
# the shards' certificate and key. Keep it out of version control.
apiVersion: v1
kind: Secret
metadata:
  name: $name
  labels: {app.kubernetes.io/name: psd}
type: Opaque
data:
EOF
for f in token ca.crt tls.crt tls.key; do
  printf '  %s: %s\n' "$f" "$(base64 -w0 <"$d/$f")"
done
