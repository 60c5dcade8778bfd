#!/usr/bin/env bash
# Build the Linux installer artifact:  dist/mtp-studio-<version>-linux-<arch>.tar.gz
#
#   packaging/build_linux.sh                 (from the repository root, after packaging/bootstrap.sh)
#   packaging/build_linux.sh --gpu vulkan    (or MTP_GPU=vulkan: also carry ggml's Vulkan backend)
#
# 1. llama.cpp with run-time backend and CPU-variant selection (packaging/build_engine_libs.py;
#    cached, about 25 minutes cold on two cores, seconds warm); with --gpu vulkan the same folder
#    plus libggml-vulkan.so, built against the machine's Vulkan headers, glslc and SPIRV-Headers
#    (Debian 12: apt-get install libvulkan-dev glslc spirv-headers; its own cache entry);
# 2. the frozen one-folder app (PyInstaller, packaging/mtp_studio.spec) with those libraries;
# 3. a tarball with the folder, a .desktop file, the icon and install.sh.
# Then test it:  python3 packaging/smoke_frozen.py   (with --vulkan for a Vulkan build: see its docstring)
#
# Why a tarball and not an AppImage: making an AppImage needs appimagetool and its
# runtime, which neither Debian nor PyPI carries (the PyPI helpers download them from
# GitHub at build time); see docs/installers.md. The folder inside is exactly what an
# AppImage would mount.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
GPU=${MTP_GPU:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --gpu) GPU=${2:-}; shift 2 ;;
        --gpu=*) GPU=${1#--gpu=}; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "error: unknown argument $1 (usage: packaging/build_linux.sh [--gpu vulkan])" >&2; exit 2 ;;
    esac
done
case "$GPU" in
    ""|none|cpu) GPU="" ;;
    vulkan) ;;
    *) echo "error: --gpu $GPU: the Linux tarball carries vulkan (or nothing); CUDA's runtime is not shipped yet" >&2
       exit 2 ;;
esac
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "error: $PY not found; run packaging/bootstrap.sh first (or set PYTHON)" >&2; exit 1; }
if ! "$PY" -c "import PyInstaller" 2>/dev/null; then
    echo "installing the packaging extra (PyInstaller) into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install -q -e ".[packaging]"
fi

VERSION=$("$PY" -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")
ARCH=$(uname -m)
NAME="mtp-studio-$VERSION-linux-$ARCH"
BUILD="$ROOT/build/installer"
OUT="$ROOT/dist"

# MTP_SDIST: a llama_cpp_python sdist already at hand (else build_engine.py's cached or downloaded one)
#
# GPU backends: --gpu vulkan adds libggml-vulkan.so beside the CPU variants. It links only the
# system's Vulkan loader (libvulkan.so.1), which is not shipped: ggml loads the backend at run
# time only when the loader loads and finds a driver (else it is skipped and a CPU variant runs),
# and a software device (Mesa's lavapipe) is listed only with MTP_STUDIO_SOFTWARE_GPU=1.
#
# CUDA is not in this tarball yet. `build_engine_libs.py --gpu cuda [--cuda-arch 89]` builds the
# same folder plus libggml-cuda.so (its own cache entry; PyPI's CUDA 13 wheels when the machine has
# no whole toolkit; measured in docs/installers.md), but it links the CUDA runtime:
# libcudart.so.13 (0.8 MB), libcublas.so.13 (57 MB) and libcublasLt.so.13 (552 MB; the
# nvidia-cublas wheel is 444 MB). Shipping those would more than double the tarball for users
# without an NVIDIA GPU, so the plan is llama.cpp's: the tarball carries libggml-cuda.so (ggml
# skips it when its libraries or the driver are missing) and the runtime is a separate release
# download unpacked into _internal/llama_cpp/lib (libggml-cuda's RUNPATH is $ORIGIN), or
# preloaded from the data folder before ggml loads its backends. Neither is built or tested yet.
GPU_ARGS=()
[ -n "$GPU" ] && GPU_ARGS=(--gpu "$GPU")
"$PY" packaging/build_engine_libs.py "${GPU_ARGS[@]}" ${MTP_SDIST:+--sdist "$MTP_SDIST"}
LIBS=$("$PY" packaging/build_engine_libs.py "${GPU_ARGS[@]}" --print-dir)

rm -rf "${BUILD:?}/dist" "${BUILD:?}/$NAME"
MTP_ENGINE_LIBS="$LIBS" "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$BUILD/dist" --workpath "$BUILD/work" packaging/mtp_studio.spec

STAGE="$BUILD/$NAME"
mv "$BUILD/dist/mtp-studio" "$STAGE"
cp packaging/linux/mtp-studio.desktop packaging/linux/install.sh "$STAGE/"
cp assets/icons/mtp-studio-256.png "$STAGE/mtp-studio.png"
cat > "$STAGE/README.txt" <<TXT
MTP Studio $VERSION for Linux ($ARCH)

Run:      ./mtp-studio
Menu:     ./install.sh        (adds it to your application menu; ./install.sh --remove undoes it)
Version:  ./mtp-studio --version

Everything it needs is in this folder: no Python, no compiler. The built-in
model (Gemma 3 270M) is inside and is unpacked into ~/.local/share/mtp-studio
on first use. Remove the app by deleting this folder (and that data folder).
TXT
if [ "$GPU" = vulkan ]; then
    cat >> "$STAGE/README.txt" <<'TXT'

GPU: this build carries llama.cpp's Vulkan backend. It is used when your system
has a Vulkan driver for your GPU (the libvulkan1 loader plus Mesa's RADV/ANV or
NVIDIA's driver); otherwise the CPU is used. Help > Hardware says which.
TXT
fi

mkdir -p "$OUT"
tar -C "$BUILD" -czf "$OUT/$NAME.tar.gz.partial" "$NAME"
mv "$OUT/$NAME.tar.gz.partial" "$OUT/$NAME.tar.gz"
ls -l "$OUT/$NAME.tar.gz"
echo "built $OUT/$NAME.tar.gz; test it with: python3 packaging/smoke_frozen.py${GPU:+ --$GPU} $OUT/$NAME.tar.gz"
