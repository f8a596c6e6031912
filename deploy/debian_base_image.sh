#!/usr/bin/env bash
# Make a Debian 12 base image from Debian's own mirror with debootstrap, for building deploy/Containerfile where
# no public container registry can be reached. Needs root, debootstrap and podman (apt-get install debootstrap podman).
#
#   sudo bash deploy/debian_base_image.sh [MIRROR]       # -> localhost/debian-bookworm:local
set -euo pipefail
MIRROR="${1:-http://deb.debian.org/debian}"
BASE="${BASE:-localhost/debian-bookworm:local}"
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE"
echo "base image $BASE; now: bash deploy/build_image.sh --build-arg BASE_IMAGE=$BASE"
