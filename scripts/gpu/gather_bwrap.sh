#!/usr/bin/env bash
# Gather bubblewrap for a lent GPU machine, whose image has none: Debian's bubblewrap package, unpacked, into
# .bwrap/ (ignored by git), carried to the device with `carry: [".bwrap"]`. A device command puts it on PATH
# (`export PATH="$PWD/.bwrap:$PATH"`) to grade with sandboxed kernels, as a grading server with bubblewrap does;
# whether it works there is course.grader.sandbox.unavailable_reason()'s to say (it needs mount namespaces).
#
# Usage: bash scripts/gpu/gather_bwrap.sh [DEST]   (default DEST: .bwrap)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${1:-.bwrap}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q bubblewrap >/dev/null)
dpkg-deb -x "$work"/bubblewrap_*.deb "$work/root"
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$work/root/usr/bin/bwrap" "$DEST/bwrap"
echo "gathered $("$DEST/bwrap" --version) in $DEST"
