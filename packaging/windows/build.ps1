# Build the Windows installer: dist\mtp-studio-<version>-windows-x64-setup.exe
#
#   pwsh packaging/windows/build.ps1            (from the repository root)
#
# Needs: Python 3.11, a C++ toolchain (Visual Studio Build Tools) and CMake for the engine,
# Inno Setup 6.3+ (iscc on PATH). Signing happens when WINDOWS_CERT_PFX (a path) and
# WINDOWS_CERT_PASSWORD are set; otherwise the installer is built unsigned.
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")

python -m venv .venv
.venv\Scripts\python -m pip install -q --upgrade pip
# llama_cpp's Python side only: its libraries come from build_engine_libs.py below, so the
# sdist's own CMake build is switched off (LLAMA_BUILD=OFF) instead of compiling llama.cpp twice.
$env:CMAKE_ARGS = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
.venv\Scripts\python -m pip install -q "llama-cpp-python==0.3.36"
Remove-Item Env:CMAKE_ARGS
.venv\Scripts\python -m pip install -q -e ".[packaging]"
.venv\Scripts\python packaging\build_engine_libs.py                   # run-time backend selection build
$libs = (.venv\Scripts\python packaging\build_engine_libs.py --print-dir).Trim()
$version = (.venv\Scripts\python -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])").Trim()

$env:MTP_ENGINE_LIBS = $libs
.venv\Scripts\python -m PyInstaller --noconfirm --clean --log-level WARN `
    --distpath build\installer\dist --workpath build\installer\work packaging\mtp_studio.spec
if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }

$iscc = @("/DAppVersion=$version", "packaging\windows\mtp-studio.iss")
if ($env:WINDOWS_CERT_PFX) {
    $sign = "signtool.exe sign /fd sha256 /tr http://timestamp.digicert.com /td sha256 " +
            "/f `$q$($env:WINDOWS_CERT_PFX)`$q /p `$q$($env:WINDOWS_CERT_PASSWORD)`$q `$f"
    $iscc = @("/DSIGN", "/Smtpsign=$sign") + $iscc
}
iscc @iscc
if ($LASTEXITCODE -ne 0) { throw "Inno Setup failed" }
Get-ChildItem dist\*-setup.exe
