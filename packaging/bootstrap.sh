#!/usr/bin/env bash
# Set up MTP Studio in ./.venv on a fresh machine: a virtual environment, the
# engine (llama-cpp-python built for this machine, or taken from the wheel
# cache), and the app itself. Safe to run again; it only does what is missing.
#   packaging/bootstrap.sh          the app
#   packaging/bootstrap.sh --test   the app and the test tools
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python packaging/build_engine.py --backend "${MTP_STUDIO_BACKEND:-cpu}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras}"
