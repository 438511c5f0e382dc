#!/bin/sh
# Builds psd's container image from Debian's packages alone (make image runs
# it; docs/kubernetes.md, "The image"). No container registry is asked:
#   1. the base: a Debian 12 root file system made by mmdebstrap
#      (--variant=apt, plus the runtime packages in ./packages and the user
#      psd from ./base-hook.sh), kept as DIR/base-KEY.tar, KEY a hash of
#      everything that shapes it, so a second run reuses it, and imported
#      with podman import as localhost/psd-base:KEY;
#   2. psd itself: a build tree of its own (DIR/meson: no CUDA, no tests,
#      installed to /usr with the symbols stripped) installed into
#      DIR/context/root;
#   3. ./Containerfile: the base plus that tree, tagged IMAGE.
# Times come from SOURCE_DATE_EPOCH (default: the last commit's time), so
# the same commit and the same Debian packages give the same image layers.
#
# usage: build-image.sh DIR IMAGE
# environment: PSD_IMAGE_MIRROR, PSD_IMAGE_SECURITY (Debian's archive and its
# security archive, e.g. snapshot.debian.org URLs for a build that picks
# the same package versions next year); PODMAN (default podman).
set -eu

if [ $# -ne 2 ]; then
  echo "usage: $0 DIR IMAGE" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
mkdir -p "$1"
dir=$(cd "$1" && pwd)
image=$2
podman=${PODMAN:-podman}
suite=bookworm
mirror=${PSD_IMAGE_MIRROR:-http://deb.debian.org/debian}
security=${PSD_IMAGE_SECURITY:-http://deb.debian.org/debian-security}

for tool in mmdebstrap "$podman" meson ninja; do
  if ! command -v "$tool" >/dev/null; then
    echo "image: $tool is not installed (sh deploy/setup.sh test installs it)" >&2
    exit 1
  fi
done
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$src" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
start=$(date +%s)

# 1. The base, made once per package list.
pkgs=$(sed 's/#.*//' "$here/packages" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
key=$({ echo "$suite $mirror $security"; cat "$here/packages" "$here/base-hook.sh";
  sed -n '/# base-options$/,/# end$/p' "$0"; } | sha256sum | cut -c1-12)
base=$dir/base-$key.tar
if [ -f "$base" ]; then
  echo "image: base $base (cached)"
else
  echo "image: making the base with mmdebstrap ($suite: $pkgs)"
  rm -f "$dir"/base-*.tar "$base.part"
  # base-options
  mmdebstrap --variant=apt --format=tar --include="$pkgs" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --setup-hook="sh '$here/base-hook.sh' setup \"\$1\"" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook="sh '$here/base-hook.sh' customize \"\$1\"" \
    "$suite" "$base.part" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" \
    "deb $security $suite-security main"
  # end
  mv "$base.part" "$base"
fi
if "$podman" image exists "localhost/psd-base:$key"; then
  echo "image: localhost/psd-base:$key (imported before)"
else
  "$podman" import "$base" "localhost/psd-base:$key"
  # The bases of older package lists go with their tarballs.
  "$podman" images --format '{{.Repository}}:{{.Tag}}' localhost/psd-base |
    grep -v ":$key\$" | xargs -r "$podman" rmi >/dev/null 2>&1 || true
fi

# 2. psd, built for the image and installed into the build context.
if [ ! -f "$dir/meson/build.ninja" ]; then
  meson setup "$dir/meson" "$src" -Dcuda=disabled -Dtests=false \
    -Dfuzz=disabled -Dprefix=/usr
fi
ninja -C "$dir/meson"
rm -rf "$dir/context"
mkdir -p "$dir/context"
meson install -C "$dir/meson" --destdir "$dir/context/root" --strip --quiet
# The Python package needs python3, which the image leaves out.
find "$dir/context/root" -type d -name dist-packages -prune -exec rm -rf {} +

# 3. The image.
rev=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
"$podman" build --timestamp "$SOURCE_DATE_EPOCH" \
  --build-arg "BASE=localhost/psd-base:$key" \
  --label "org.opencontainers.image.revision=$rev" \
  -f "$here/Containerfile" -t "$image" "$dir/context"
echo "image: $image built in $(($(date +%s) - start)) s" \
  "($("$podman" image inspect --format '{{.Size}}' "$image") bytes)"
