#!/usr/bin/env bash
# Install the system packages facefuse's integration tests and deployment use:
#   redis-server  (L2 result cache; started on a free loopback port by test fixtures)
#   nginx         (reverse proxy in front of uvicorn; integration tests and deploy/)
#   prometheus    (prometheus + promtool: the live stack test scrapes the replicas and
#                  checks the shipped alert rules and dashboard queries)
#   podman, buildah, debootstrap  (scripts/build-image.sh: the local base rootfs and the image)
#   binutils      (strip: scripts/build-image.sh strips the image's wheels' modules)
#   cmake, make, g++  (deploy/build-slim-opencv.py compiles the images' OpenCV)
#   kubernetes-client  (kubectl kustomize renders deploy/k8s; skipped when a kubectl exists)
#   libimage-exiftool-perl  (exiftool: an independent reader of the provenance XMP in tests)
#   chromium, chromium-driver  (the headless browser the web playground is tested in)
#   jq, curl  (the shell examples of README.md and docs/, run as written by a doc test)
#
# Idempotent: packages already on PATH are skipped. Needs root (or passwordless sudo)
# to install; when neither is available it prints the command to run and exits 1
# only if something is actually missing.
#
# Usage: bash scripts/install-system-deps.sh
set -euo pipefail

declare -A BINARY_OF=([redis-server]=redis-server [nginx]=nginx [prometheus]=promtool
    [podman]=podman [buildah]=buildah [debootstrap]=debootstrap [kubernetes-client]=kubectl
    [libimage-exiftool-perl]=exiftool [chromium]=chromium [chromium-driver]=chromedriver
    [jq]=jq [curl]=curl [binutils]=strip [cmake]=cmake [make]=make [g++]=g++)
PATH="$PATH:/usr/sbin:/sbin"

missing=()
for pkg in redis-server nginx prometheus podman buildah debootstrap kubernetes-client \
        libimage-exiftool-perl chromium chromium-driver jq curl binutils cmake make g++; do
    if command -v "${BINARY_OF[$pkg]}" >/dev/null 2>&1; then
        echo "install-system-deps: ${pkg} present ($(command -v "${BINARY_OF[$pkg]}"))"
    else
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-system-deps: nothing to do"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: apt-get not found; install these with your package manager: ${missing[*]}" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "install-system-deps: missing ${missing[*]} and not root; run:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-system-deps: installing ${missing[*]}"
"${SUDO[@]}" apt-get update
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
# The Debian prometheus package starts a system service where systemd runs; the
# tests start their own on free ports.

# The Debian packages try to start system services; our tests start their own
# instances on free ports, so a service that failed to start (no systemd in a
# container) is not an error here.
for pkg in "${missing[@]}"; do
    command -v "${BINARY_OF[$pkg]}" >/dev/null 2>&1 || {
        echo "install-system-deps: ${pkg} still missing after install" >&2
        exit 1
    }
done
echo "install-system-deps: done"
