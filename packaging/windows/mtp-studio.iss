; Inno Setup script for MTP Studio (Inno Setup 6.3 or later).
;
; Input: the frozen one-folder app from packaging/mtp_studio.spec (packaging/windows/build.ps1
; makes it, then runs this). Output: dist\mtp-studio-<version>-windows-x64-setup.exe with a
; Start-menu entry, an optional desktop icon and an uninstaller.
;
;   iscc /DAppVersion=0.1.0 packaging\windows\mtp-studio.iss
;
; Signing, when a certificate is configured (see docs/installers.md): define SIGN and name a
; sign tool called "mtpsign" on the command line; Setup, the uninstaller and mtp-studio.exe are
; then signed by Inno Setup itself:
;
;   iscc /DAppVersion=0.1.0 /DSIGN "/Smtpsign=signtool.exe sign /fd sha256 /tr http://timestamp.digicert.com /td sha256 /f $qcert.pfx$q /p $qPASSWORD$q $f" packaging\windows\mtp-studio.iss

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\build\installer\dist\mtp-studio"
#endif
#define AppName "MTP Studio"
#define AppExe "mtp-studio.exe"

[Setup]
; A fixed AppId: upgrades replace the installed version instead of installing beside it.
AppId={{6B0F3C52-8E0A-4C1E-9D55-2A7C1F4E9B31}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=MTP Studio
VersionInfoVersion={#AppVersion}
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
; Per-user install without admin rights is offered; all users needs elevation.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=mtp-studio-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\assets\icons\mtp-studio.ico
UninstallDisplayIcon={app}\{#AppExe}
UninstallDisplayName={#AppName}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
#ifdef SIGN
SignTool=mtpsign
SignedUninstaller=yes
#endif

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
#ifdef SIGN
Source: "{#SourceDir}\{#AppExe}"; DestDir: "{app}"; Flags: ignoreversion signonce
#else
Source: "{#SourceDir}\{#AppExe}"; DestDir: "{app}"; Flags: ignoreversion
#endif
Source: "{#SourceDir}\*"; DestDir: "{app}"; Excludes: "{#AppExe}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

; The app's own data (conversations, settings, the unpacked default model, downloaded
; models) lives in the user's profile and is kept on uninstall, like any document.
