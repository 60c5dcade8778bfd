#!/usr/bin/env bash
# Build the macOS app and disk image:  dist/mtp-studio-<version>-macos-<arch>.dmg
#
#   packaging/macos/build_app.sh            (from the repository root, on macOS 12+)
#
# Needs Python 3.11, Xcode command line tools and CMake. Apple Silicon builds carry Metal
# (--gpu metal); Intel builds carry the CPU variants. Signing and notarization run when
# credentials are configured (docs/installers.md), otherwise the app is ad-hoc signed
# (it runs on this Mac; Gatekeeper elsewhere asks the user to allow it):
#   MACOS_SIGN_IDENTITY      "Developer ID Application: Name (TEAMID)", in the keychain
#   MACOS_NOTARY_APPLE_ID, MACOS_NOTARY_TEAM_ID, MACOS_NOTARY_PASSWORD (an app-specific password)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=${PYTHON:-.venv/bin/python}
ARCH=$(uname -m)
GPU=""
[ "$ARCH" = "arm64" ] && GPU="--gpu metal"

if [ ! -x "$PY" ]; then
    python3 -m venv .venv
    # llama_cpp's Python side only; its libraries come from build_engine_libs.py
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" .venv/bin/pip install -q "llama-cpp-python==0.3.36"
    .venv/bin/pip install -q -e ".[packaging]"
fi
VERSION=$("$PY" -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")
# shellcheck disable=SC2086
"$PY" packaging/build_engine_libs.py $GPU
# shellcheck disable=SC2086
LIBS=$("$PY" packaging/build_engine_libs.py $GPU --print-dir)

BUILD="$ROOT/build/installer"
rm -rf "$BUILD/dist"
MTP_ENGINE_LIBS="$LIBS" "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$BUILD/dist" --workpath "$BUILD/work" packaging/mtp_studio.spec
APP="$BUILD/dist/MTP Studio.app"

ENTITLEMENTS="$ROOT/packaging/macos/entitlements.plist"
IDENTITY=${MACOS_SIGN_IDENTITY:--}   # "-" = ad hoc
sign() {
    if [ "$IDENTITY" = "-" ]; then
        codesign --force --sign - "$@"
    else  # hardened runtime and a secure timestamp: what notarization requires
        codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$IDENTITY" "$@"
    fi
}
# Inside out: every nested library, then the frameworks, then the executable, then the bundle.
# (codesign --deep is not used: Apple advises against it for signing.)
find "$APP/Contents" -type f \( -name "*.so" -o -name "*.dylib" -o -perm -u+x -path "*/Frameworks/*" \) \
    ! -path "*.framework/*" -print0 | while IFS= read -r -d '' f; do
    file -b "$f" | grep -q "Mach-O" && sign "$f"
done
find "$APP/Contents" -type d -name "*.framework" -prune -print0 | while IFS= read -r -d '' fw; do sign "$fw"; done
sign "$APP/Contents/MacOS/mtp-studio"
sign "$APP"
codesign --verify --deep --strict --verbose=2 "$APP"

STAGE="$BUILD/dmg"
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
mkdir -p dist
DMG="dist/mtp-studio-$VERSION-macos-$ARCH.dmg"
rm -f "$DMG"
hdiutil create -volname "MTP Studio" -srcfolder "$STAGE" -ov -format UDZO "$DMG"

if [ "$IDENTITY" != "-" ]; then
    codesign --force --timestamp --sign "$IDENTITY" "$DMG"
    if [ -n "${MACOS_NOTARY_APPLE_ID:-}" ]; then
        xcrun notarytool submit "$DMG" --apple-id "$MACOS_NOTARY_APPLE_ID" --team-id "$MACOS_NOTARY_TEAM_ID" \
            --password "$MACOS_NOTARY_PASSWORD" --wait
        xcrun stapler staple "$DMG"
        spctl --assess --type open --context context:primary-signature -vv "$DMG"
    else
        echo "signed but not notarized: MACOS_NOTARY_APPLE_ID is not set"
    fi
else
    echo "ad-hoc signed (no MACOS_SIGN_IDENTITY): not for distribution"
fi
ls -l "$DMG"
