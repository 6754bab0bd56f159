#!/usr/bin/env bash
# Build the facefuse CPU image with podman from a prepared, offline build context.
#
#   1. the base: BASE if given (e.g. python:3.11-slim-bookworm from a registry),
#      otherwise the local Debian base of scripts/build-base.sh (cached);
#   2. the context: every wheel the image installs (pip wheel with this host's pip
#      configuration), the pinned model sources and the sample photos (verified by
#      sha256 when the builder converts and quantizes the models);
#   3. podman build --isolation chroot (no container runtime needed), tagged
#      <version>-<git revision> and <version>; never only "latest". From
#      deploy/Dockerfile, two images: the API (target api, NAME) and the job worker
#      (target worker, NAME-worker: PyAV and its FFmpeg, which the API has not).
#
# Usage: bash scripts/build-image.sh [--dockerfile deploy/Dockerfile] [--tag NAME]
#        [--target api|worker]     only that image (default: both)
#        [--context-only DIR]      prepare the context for docker build elsewhere
# Prints the image references (name:version-revision), the worker's first and the
# API's on the last line of stdout.
# Env:   FACEFUSE_HOME, BASE, IMAGE_NAME (default localhost/facefuse), QUANTIZE (1),
#        SLIM_OPENCV (1: OpenCV built with the used modules only; 0: the PyPI wheel),
#        EXTRA_WHEELS (requirements fetched into extra/, for bench/Dockerfile.naive)
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin:/sbin"

DOCKERFILE=deploy/Dockerfile
NAME="${IMAGE_NAME:-localhost/facefuse}"
CONTEXT_ONLY=""
TARGETS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dockerfile) DOCKERFILE="$2"; shift 2 ;;
        --tag) NAME="$2"; shift 2 ;;
        --context-only) CONTEXT_ONLY="$2"; shift 2 ;;
        --target) TARGETS="$2"; shift 2 ;;
        *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
    esac
done
HOME_DIR="${FACEFUSE_HOME:-$HOME/.cache/facefuse}"
PY=.venv/bin/python
log() { echo "build-image: $*" >&2; }

VERSION="$($PY -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')"
REVISION="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD 2>/dev/null || REVISION="${REVISION}-dirty"
CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

CTX="${CONTEXT_ONLY:-$(mktemp -d -t facefuse-image-ctx-XXXXXX)}"
[ -n "$CONTEXT_ONLY" ] || trap 'rm -rf "$CTX"' EXIT
mkdir -p "$CTX/pip" "$CTX/deps" "$CTX/project" "$CTX/home" "$CTX/extra"
log "context in $CTX"
# Reproducible wheels (zip timestamps from the last commit), so an unchanged tree
# reuses podman's cached layers.
SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 315532800)"
export SOURCE_DATE_EPOCH
# Dependencies and the project in separate folders so an edit of the source reuses
# the cached dependency layer.
$PY -m pip wheel -q --no-deps -w "$CTX/project" . >&2
# async-timeout: redis needs it on CPython < 3.11.3 (Debian bookworm has 3.11.2),
# which this host's interpreter may not, so its marker would drop it here.
$PY -m pip wheel -q -w "$CTX/deps" "$(ls "$CTX"/project/facefuse-*.whl)[serve,build]" \
    'async-timeout>=4.0.3' >&2
rm -f "$CTX"/deps/facefuse-*.whl
# OpenCV with only the modules facefuse calls, in place of the PyPI wheel (~140 MB
# less: deploy/build-slim-opencv.py; compiled once, then cached under FACEFUSE_HOME).
# SLIM_OPENCV=0 keeps the PyPI wheel.
if [ "${SLIM_OPENCV:-1}" = 1 ]; then
    slim="$($PY deploy/build-slim-opencv.py --home "$HOME_DIR")"
    rm -f "$CTX"/deps/opencv_python_headless-*.whl
    cp "$slim" "$CTX/deps/"
fi
# Extension modules without their symbol tables (~19 MB; the base has no binutils).
$PY deploy/strip-wheels.py "$CTX"/deps/*.whl >&2
$PY -m pip download -q --no-deps --only-binary=:all: -d "$CTX/pip" pip >&2
if [ -n "${EXTRA_WHEELS:-}" ]; then
    # shellcheck disable=SC2086  # a list of requirements
    $PY -m pip download -q --no-deps --only-binary=:all: -d "$CTX/extra" $EXTRA_WHEELS >&2
fi
# The pinned sources and samples, fetched (and verified) by the project's own commands.
.venv/bin/facefuse samples >&2
.venv/bin/facefuse models build >&2
cp -r "$HOME_DIR/downloads" "$HOME_DIR/samples" "$CTX/home/"
cp deploy/strip-venv.sh deploy/compile-startup.py "$CTX/"
if [ -n "$CONTEXT_ONLY" ]; then
    log "context ready: docker build -f $DOCKERFILE --build-arg VERSION=$VERSION --build-arg REVISION=$REVISION $CTX"
    exit 0
fi

BASE_REF="${BASE:-$(bash scripts/build-base.sh)}"
# deploy/Dockerfile has two runtime targets; another Dockerfile builds its last stage.
if [ -z "$TARGETS" ]; then
    if [ "$DOCKERFILE" = deploy/Dockerfile ]; then TARGETS="worker api"; else TARGETS="-"; fi
fi
for target in $TARGETS; do
    name="$NAME"
    [ "$target" = worker ] && name="$NAME-worker"
    ref="$name:$VERSION-$REVISION"
    log "building $ref (target $target) from $DOCKERFILE on $BASE_REF"
    # --format docker: the OCI image format has no HEALTHCHECK (podman would drop it).
    # shellcheck disable=SC2046  # no --target for a single-target Dockerfile
    podman build --isolation chroot --layers --format docker \
        -f "$DOCKERFILE" $([ "$target" = - ] || echo --target "$target") \
        --build-arg BASE="$BASE_REF" \
        --build-arg VERSION="$VERSION" \
        --build-arg REVISION="$REVISION" \
        --build-arg CREATED="$CREATED" \
        --build-arg QUANTIZE="${QUANTIZE:-1}" \
        -t "$ref" -t "$name:$VERSION" "$CTX" >&2
    echo "$ref"
done
