#!/bin/sh
# Remove from the image's virtual environment what the serving runtime never imports.
# Runs in the builder stage (POSIX sh: the base has no bash guarantees).
#   $1  the venv root, e.g. /opt/facefuse
# Every removal is either a whole distribution no runtime module imports, or a
# directory of tests, bytecode or offline tooling inside one that is kept.
set -eu
VENV="$1"
SITE="$(echo "$VENV"/lib/python3*/site-packages)"

# The [build] extra (ONNX conversion and INT8/FP16 tooling) and what only it needs.
"$VENV/bin/pip" uninstall -y -q tflite2onnx tflite onnxconverter-common onnx sympy mpmath \
    ml_dtypes
# uvicorn[standard] extras a production server without --reload never loads.
"$VENV/bin/pip" uninstall -y -q watchfiles websockets
# Dependencies no runtime module imports (checked: none in sys.modules after importing
# the server and drawing the CLI's progress bar): rich's syntax highlighter and Markdown
# renderer (only rich.syntax / rich.markdown load them), and protobuf, which only
# onnxruntime's offline tools (removed below) use. 7.2 MiB.
"$VENV/bin/pip" uninstall -y -q pygments markdown-it-py mdurl protobuf
# uvicorn[standard]'s readers of --log-config YAML files and --env-file (facefuse serve
# passes neither), and Pillow's colour-management module (the decoder applies no ICC
# profile; nothing imports PIL.ImageCms): 1.2 MiB.
"$VENV/bin/pip" uninstall -y -q pyyaml python-dotenv
rm -f "$SITE"/PIL/_imagingcms.*.so "$SITE"/pillow.libs/liblcms2-*.so*
# The installer itself, last: nothing installs into the image after this.
"$VENV/bin/pip" uninstall -y -q pip setuptools wheel 2>/dev/null \
    || "$VENV/bin/python" -m pip uninstall -y -q pip
rm -f "$VENV"/bin/pip "$VENV"/bin/pip3* "$VENV"/bin/tflite2onnx "$VENV"/bin/isympy

# The offline toolchains inside onnxruntime (quantization, transformer optimisers,
# model conversion tools): the server only creates inference sessions.
rm -rf "$SITE/onnxruntime/quantization" "$SITE/onnxruntime/transformers" \
    "$SITE/onnxruntime/tools" "$SITE/onnxruntime/datasets" "$SITE/onnxruntime/backend"
# The C-API library (35 MB): the Python binding is self-contained (it links only
# libc/libstdc++), libonnxruntime.so serves C/C++ callers and plugin EPs.
rm -f "$SITE"/onnxruntime/capi/libonnxruntime.so*
# The project's own offline toolchain (model build and quantization) has no runtime use.
rm -rf "$SITE/facefuse/models/build" "$SITE/facefuse/models/quantize" \
    "$SITE/facefuse/toolchain"
# Pillow's AVIF codec (its plugin degrades to "not supported" without it): the decoder
# accepts JPEG, PNG and WebP only. Its Tk bridge has no use in a server.
rm -f "$SITE"/PIL/_avif.*.so "$SITE"/pillow.libs/libavif-*.so* "$SITE"/PIL/_imagingtk.*.so
# OpenCV's Haar cascades and the numpy/PIL test suites; C headers.
rm -rf "$SITE/cv2/data" "$SITE/numpy/_core/tests" "$SITE/numpy/tests" \
    "$SITE"/numpy/*/tests "$SITE/numpy/_core/include" "$SITE/numpy/f2py" \
    "$SITE/numpy/_pyinstaller" "$SITE/numpy/typing/tests"
# numpy's distutils (a build system, deprecated) and the static libraries and Cython
# sources that only compile other extensions: 1.3 MiB.
rm -rf "$SITE/numpy/distutils"
find "$SITE" -type f \( -name '*.a' -o -name '*.pyx' -o -name '*.pxi' \) -delete
find "$SITE" -depth -type d \( -name tests -o -name test \) -path '*/site-packages/*/*' \
    -prune -exec rm -rf {} +
find "$VENV" -depth -type d -name __pycache__ -exec rm -rf {} +
find "$VENV" -type f \( -name '*.pyc' -o -name '*.pyi' -o -name '*.c' -o -name '*.h' \
    -o -name '*.pxd' \) -delete
