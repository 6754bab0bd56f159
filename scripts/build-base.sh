#!/usr/bin/env bash
# Build the local image base: Debian bookworm (debootstrap --variant=minbase) plus
# Debian's python3.11 (with venv; pip comes from the build context), imported into podman. It has the same
# content that matters as python:3.11-slim-bookworm (glibc, CPython 3.11, CA
# certificates) for hosts where no registry pull works.
#
# The root filesystem tarball is cached under $FACEFUSE_HOME/deploy/, keyed by this
# script's content, so the slow debootstrap runs once per machine; the podman import
# is skipped when the image with that key already exists.
#
# Usage: bash scripts/build-base.sh            prints the image reference on stdout
# Env:   FACEFUSE_HOME (default ~/.cache/facefuse), DEBIAN_MIRROR (default deb.debian.org)
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"

MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3.11,ca-certificates"
HOME_DIR="${FACEFUSE_HOME:-$HOME/.cache/facefuse}"
KEY="$(sha256sum "$0" | cut -c1-12)"
IMAGE="localhost/facefuse-base:bookworm-py311-${KEY}"
CACHE="$HOME_DIR/deploy/base-bookworm-py311-${KEY}.tar"

log() { echo "build-base: $*" >&2; }

if podman image exists "$IMAGE"; then
    log "$IMAGE present"
    echo "$IMAGE"
    exit 0
fi

if [ ! -s "$CACHE" ]; then
    mkdir -p "$(dirname "$CACHE")"
    ROOT="$(mktemp -d -t facefuse-rootfs-XXXXXX)"
    trap 'rm -rf "$ROOT"' EXIT
    log "debootstrap bookworm minbase + ${PACKAGES} into $ROOT"
    if ! debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOT" "$MIRROR" >&2; then
        tail -n 40 "$ROOT/debootstrap/debootstrap.log" >&2 || true
        exit 1
    fi
    # What an image never needs: apt's package lists and caches, docs, man pages,
    # locales other than C, and Python bytecode (rebuilt lazily, not shipped).
    rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/var/cache/debconf/*-old \
        "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
        "$ROOT"/var/log/*.log "$ROOT"/var/log/apt/* "$ROOT"/tmp/* "$ROOT"/proc/* "$ROOT"/sys/* \
        "$ROOT"/dev/*
    find "$ROOT"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
    find "$ROOT" -name __pycache__ -type d -prune -exec rm -rf {} +
    ln -sf python3.11 "$ROOT/usr/bin/python3"
    tar -C "$ROOT" --numeric-owner -cf "$CACHE.tmp" .
    mv "$CACHE.tmp" "$CACHE"
    log "cached $CACHE ($(du -h "$CACHE" | cut -f1))"
fi

log "importing $CACHE as $IMAGE"
podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$CACHE" "$IMAGE" >&2
echo "$IMAGE"
