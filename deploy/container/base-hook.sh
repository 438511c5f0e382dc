#!/bin/sh
# mmdebstrap's hooks for psd's base root file system (build-image.sh):
#   setup DIR      before any package: apt never picks usrmerge, which would
#                  bring perl (50 MB) to satisfy init-system-helpers'
#                  "usrmerge | usr-is-merged", where mmdebstrap's merged-usr
#                  hooks merge /usr and install usr-is-merged;
#   customize DIR  after the packages: the user psd (uid and gid 7100, as
#                  deploy/k8s runs the pods) and its checkpoint directory,
#                  and no host files (resolv.conf, hostname: podman and
#                  Kubernetes give their own), so that two hosts build the
#                  same base.
set -eu
root=$2
case $1 in
setup)
  mkdir -p "$root/etc/apt/preferences.d"
  printf 'Package: usrmerge\nPin: release *\nPin-Priority: -1\n' \
    >"$root/etc/apt/preferences.d/psd-no-usrmerge"
  ;;
customize)
  echo 'psd:x:7100:' >>"$root/etc/group"
  echo 'psd:!::' >>"$root/etc/gshadow"
  echo 'psd:x:7100:7100:psd parameter server:/var/lib/psd:/usr/sbin/nologin' \
    >>"$root/etc/passwd"
  echo 'psd:!:1::::::' >>"$root/etc/shadow"
  mkdir -p "$root/var/lib/psd" "$root/etc/psd"
  chown 7100:7100 "$root/var/lib/psd"
  chmod 0750 "$root/var/lib/psd"
  rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
  ;;
*)
  echo "usage: $0 setup|customize DIR" >&2
  exit 2
  ;;
esac
