#!/usr/bin/env bash
# Set up MTP Studio in ./.venv on a fresh machine: a virtual environment, the
# engine (llama-cpp-python built for this machine, or taken from the wheel
# cache), and the app itself. Safe to run again; it only does what is missing.
#   packaging/bootstrap.sh          the app
#   packaging/bootstrap.sh --test   the app, the test tools, and llama.cpp's own MTP driver
#                                   (llama-speculative-simple, which the tests compare our loop with)
#                                   and ggml's RPC server (the multi-machine tests run two of them)
#   MTP_STUDIO_BACKEND=vulkan packaging/bootstrap.sh
#                                   the Vulkan engine instead of the CPU one (installs Debian's
#                                   libvulkan-dev, glslc and Mesa's drivers when run as root with apt)
#   MTP_STUDIO_VENV=.venv-vulkan    another virtual environment than .venv (the GPU tier keeps
#                                   its Vulkan engine apart from the CPU one the tests use)
# Without --test the RPC server is not built here: only a machine that lends its
# devices needs it, and `mtp-studio rpc-server` builds it on first use (same
# script, several minutes cold, with progress) instead of every install paying.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BACKEND=${MTP_STUDIO_BACKEND:-cpu}
VENV=${MTP_STUDIO_VENV:-.venv}
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# Qt needs a few system libraries that minimal Debian images lack. Install
# them when we can (root with apt); otherwise say which are missing.
need_libs=""
for lib in libGL.so.1 libEGL.so.1 libxkbcommon.so.0 libxkbcommon-x11.so.0 libfontconfig.so.1 libdbus-1.so.3 \
           libglib-2.0.so.0 libX11.so.6 libxcb-cursor.so.0; do
  # not grep -q: it stops reading early, ldconfig dies of SIGPIPE and pipefail calls the library missing
  ldconfig -p 2>/dev/null | grep "$lib" >/dev/null || need_libs="$need_libs $lib"
done
if [ -n "$need_libs" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing system libraries for Qt:$need_libs"
    apt-get update -qq && apt-get install -y -qq libgl1 libegl1 libxkbcommon0 libxkbcommon-x11-0 \
      libfontconfig1 libdbus-1-3 libglib2.0-0 libx11-6 libx11-xcb1 libxcb-cursor0 libxcb-icccm4 \
      libxcb-keysyms1 libxcb-shape0 libxcb-render-util0 libxcb-image0 >/dev/null
  else
    echo "warning: Qt needs these system libraries:$need_libs (install them with your package manager)" >&2
  fi
fi

# The Vulkan backend compiles its shaders with glslc against the Vulkan and
# SPIR-V headers; Mesa's drivers give a machine without a GPU a software
# device (lavapipe) that the GPU tier runs on (scripts/gpu_tier.sh).
if [ "$BACKEND" = vulkan ]; then
  if ! command -v glslc >/dev/null || [ ! -f /usr/include/vulkan/vulkan.h ] \
     || [ ! -d /usr/share/cmake/SPIRV-Headers ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "Installing the Vulkan build tools and Mesa's Vulkan drivers"
      apt-get update -qq && apt-get install -y -qq libvulkan-dev glslc spirv-headers mesa-vulkan-drivers >/dev/null
    else
      echo "error: the Vulkan engine needs glslc and the Vulkan and SPIR-V headers; install them first" \
           "(Debian/Ubuntu: sudo apt-get install libvulkan-dev glslc spirv-headers mesa-vulkan-drivers)" >&2
      exit 1
    fi
  fi
fi

"$VENV/bin/python" packaging/build_engine.py --backend "$BACKEND"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".${extras}"
if [ "${1:-}" = "--test" ]; then
  # Built from the same sdist and patches as the engine and cached beside its
  # wheel (about 7 minutes cold on two cores, seconds when cached). The record
  # it leaves in .venv tells the tests this set-up ran, so a missing driver
  # fails them instead of skipping.
  "$VENV/bin/python" packaging/build_reference_driver.py --backend "$BACKEND" --record
fi
