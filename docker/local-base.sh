#!/bin/sh
# Make the image's base locally, for machines that reach Debian's package mirror but no container
# registry: a minimal Debian 12 root filesystem (debootstrap) imported as BASE_IMAGE (podman),
# and uv's binary from this machine imported as UV_IMAGE. Pass them to the build:
#   --build-arg BASE_IMAGE=localhost/sparkinfer-base:bookworm --build-arg UV_IMAGE=localhost/uv:local
# EXTRA_CA_DIR: a folder of PEM *.crt files trusted inside the base (a TLS-inspecting proxy's
# CA, say); only the locally made base carries them.
# Needs root, debootstrap and podman. Usage: [EXTRA_CA_DIR=DIR] [UV_BIN=PATH] sh docker/local-base.sh [WORKDIR]
set -eu
work="${1:-/var/tmp/sparkinfer-base}"
suite=bookworm
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
rootfs="$work/rootfs"

if [ ! -x "$rootfs/bin/sh" ]; then
    mkdir -p "$work"
    debootstrap --variant=minbase --include=ca-certificates "$suite" "$rootfs" "$mirror"
fi
if [ -n "${EXTRA_CA_DIR:-}" ]; then
    cp "$EXTRA_CA_DIR"/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates
fi
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | podman import - localhost/sparkinfer-base:$suite

uv_bin="${UV_BIN:-$(command -v uv)}"
if [ "$(head -c 2 "$uv_bin")" = "#!" ]; then
    echo "$uv_bin is a script (a version manager's shim?): set UV_BIN to uv's binary" >&2
    exit 1
fi
stage="$work/uv"
mkdir -p "$stage"
cp -L "$uv_bin" "$stage/uv"
tar -C "$stage" -c uv | podman import - localhost/uv:local
echo "BASE_IMAGE=localhost/sparkinfer-base:$suite UV_IMAGE=localhost/uv:local"
