#!/bin/sh
# Add MTP Studio to this user's application menu (no root needed), or remove it again.
#   ./install.sh            link the app into ~/.local/bin and add the menu entry and icon
#   ./install.sh --remove   take them away (the app folder itself is left where it is)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
BIN=$HOME/.local/bin
if [ "${1:-}" = "--remove" ]; then
    rm -f "$BIN/mtp-studio" "$DATA/applications/mtp-studio.desktop" \
          "$DATA/icons/hicolor/256x256/apps/mtp-studio.png"
    echo "MTP Studio removed from the menu. Delete $HERE to remove the app."
    exit 0
fi
mkdir -p "$BIN" "$DATA/applications" "$DATA/icons/hicolor/256x256/apps"
ln -sf "$HERE/mtp-studio" "$BIN/mtp-studio"
cp "$HERE/mtp-studio.png" "$DATA/icons/hicolor/256x256/apps/mtp-studio.png"
sed "s|^Exec=mtp-studio|Exec=\"$HERE/mtp-studio\"|" "$HERE/mtp-studio.desktop" > "$DATA/applications/mtp-studio.desktop"
if command -v update-desktop-database >/dev/null 2>&1; then
    update-desktop-database "$DATA/applications" || true
fi
echo "MTP Studio is in the application menu (and on PATH as $BIN/mtp-studio)."
