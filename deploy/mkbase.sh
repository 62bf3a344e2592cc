#!/bin/sh
# Build a Debian bookworm minbase root filesystem with mmdebstrap and import it into podman.
#
#   deploy/mkbase.sh NAME PACKAGE...      prints the image it made or found: localhost/NAME:KEY
#
# No public container registry is needed: the packages come from Debian's archive (the
# host's apt sources), so the base is as reproducible as the archive snapshot.  KEY hashes
# the package list and this script, so a changed recipe is a new image and an unchanged one
# is never built twice: the tar is kept in $SEEDANCE_IMAGE_CACHE (default
# ~/.cache/seedance-images) and re-imported when podman's store lost the image.  The .debs
# are kept there too, so a rebuild reads no network.  Documentation, man pages and
# translations are left out (dpkg path-exclude): nothing in an agent's image reads them.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 NAME PACKAGE..." >&2; exit 2; }
name=$1; shift
cache=${SEEDANCE_IMAGE_CACHE:-$HOME/.cache/seedance-images}
packages=$(printf '%s\n' "$@" | sort -u | paste -sd, -)
key=$( { printf '%s\n' "bookworm" "$packages"; cat "$0"; } | sha256sum | cut -c1-12)
image=localhost/$name:$key
tar=$cache/$name-$key.tar
if podman image exists "$image"; then echo "$image"; exit 0; fi
mkdir -p "$cache/debs"
if [ ! -s "$tar" ]; then
  # one builder at a time per tar: a second `make image` waits instead of racing the first
  exec 9>"$tar.lock"; flock 9
  if [ ! -s "$tar" ]; then
    mmdebstrap --quiet --variant=minbase --format=tar --include="$packages" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      --skip=essential/unlink \
      --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
      --setup-hook="sync-in $cache/debs /var/cache/apt/archives/" \
      --customize-hook="sync-out /var/cache/apt/archives $cache/debs" \
      --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*_Packages "$1"/var/lib/apt/lists/*_InRelease' \
      bookworm "$tar.part" >&2
    mv "$tar.part" "$tar"
  fi
fi
podman import --quiet "$tar" "$image" >/dev/null
echo "$image"
