#!/bin/bash
# Builds the local stand-in for python:3.11-slim when no registry answers: Debian bookworm
# (debootstrap minbase from the host's own Debian mirror) with its python3 (3.11), venv
# support and CA certificates, imported as $BASE_IMAGE. Skips when the image exists.
# Usage: tools/image/base.sh [image name]   (default localhost/durable-mqtt-base:bookworm)
set -euo pipefail
source "$(dirname "$0")/engine.sh"
BASE_IMAGE=${1:-localhost/durable-mqtt-base:bookworm}
if $ENGINE image inspect "$BASE_IMAGE" >/dev/null 2>&1; then exit 0; fi
command -v debootstrap >/dev/null || {
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null; }
# The mirror the host uses (deb822 or one-line sources), else Debian's default.
MIRROR=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | sed -n \
  's/^URIs: *\([^ ]*\).*/\1/p; s/^deb \(\[[^]]*\] \)\?\([^ ]*\) bookworm .*/\2/p' | grep -v security | head -1 || true)
ROOTFS=$(mktemp -d /var/tmp/durable-mqtt-base.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOTFS" "${MIRROR:-http://deb.debian.org/debian}" >"$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log"; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then  # updates and security, like the host
  rm -f "$ROOTFS/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$ROOTFS/etc/apt/sources.list.d/"
  chroot "$ROOTFS" sh -c 'apt-get -o APT::Sandbox::User=root update -q && DEBIAN_FRONTEND=noninteractive apt-get -o APT::Sandbox::User=root upgrade -y -q' >/dev/null
fi
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
tar -C "$ROOTFS" -c . | $ENGINE import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null 2>&1
echo "base image $BASE_IMAGE from debootstrap ($MIRROR)"
