#!/bin/sh
# Installs the Debian 12 packages psd needs, only those still missing, so a
# second run does nothing. Run as root (make demo / make test call it).
# `setup.sh test` also installs what only the tests use (make test, soak and
# bench call it that way), so that they run in CI rather than skip.
# `setup.sh list` prints every package of both lists, one a line, and
# installs nothing (tests/integration/test_setup.py reads it).
set -eu

PKGS="meson ninja-build pkg-config gcc libc6-dev make python3 \
libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libuv1-dev libopenblas-dev \
check openssl libjansson-dev libsystemd-dev zlib1g-dev dataset-fashion-mnist \
python3-numpy clang python3-dev libmicrohttpd-dev"
# Test-only: a stock gRPC client (tests/integration/test_psd.py) and PyTorch,
# the baseline that bench train runs alongside psd (tests/bench/torch_baseline.py).
# make image and integration-image: podman (runc where crun cannot run on a
# host's cgroups), mmdebstrap for the base, and rootless podman's helpers.
TEST_PKGS="python3-grpcio python3-torch python3-prometheus-client slurmctld \
slurmd slurm-client munge python3-yaml podman buildah mmdebstrap uidmap \
fuse-overlayfs slirp4netns runc"
# ip(8), for the network namespaces of integration-netns and integration-faults;
# iptables, for integration-relayout's link cut between two shards.
TEST_PKGS="$TEST_PKGS iproute2 iptables"
if [ "${1:-}" = test ] || [ "${1:-}" = list ]; then
  PKGS="$PKGS $TEST_PKGS"
fi
if [ "${1:-}" = list ]; then
  printf '%s\n' $PKGS
  exit 0
fi

missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing="$missing $p"
  fi
done
if [ -z "$missing" ]; then
  echo "setup: all Debian packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup: missing Debian packages:$missing" >&2
  echo "setup: run as root, or: sudo apt-get install$missing" >&2
  exit 1
fi
echo "setup: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends $missing
