"""The Hardware page's "Remote devices (ggml RPC)" box: the servers Preferences names
(or others typed here), each with its devices and memory.

The probe runs in a child process (``mtp-studio rpc-probe --json``), with a
timeout per server, so a dead or slow host shows a message, never a frozen
window. A server that a loaded model is using answers nobody else (ggml RPC
serves one client at a time): it shows as busy.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.json_process import JsonProcess
from app.process import ProcessOutcome


class RemoteDevicesBox(QGroupBox):
    def __init__(self, servers: str = "", parent: QWidget | None = None) -> None:
        super().__init__("Remote devices (ggml RPC)", parent)
        self.servers = QLineEdit(servers)
        self.servers.setPlaceholderText("host:port, host:port … (Preferences → Remote devices sets the ones used)")
        self.probe_button = QPushButton("Probe")
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Server", "Device", "Memory"])
        self.table.horizontalHeader().setStretchLastSection(True)
        for column in (0, 1):  # an address or an error is read whole, not cut at the default width
            self.table.horizontalHeader().setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().hide()
        self.status = QLabel("No remote servers named. Run `mtp-studio rpc-server` on a machine that lends its "
                             "devices; see docs/multi-machine.md (no authentication: trusted LAN or SSH tunnel).")
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.servers, 1)
        row.addWidget(self.probe_button)
        col = QVBoxLayout(self)
        col.addLayout(row)
        col.addWidget(self.table)
        col.addWidget(self.status)
        self._proc = JsonProcess("the RPC probe", self)
        self._proc.sig_message.connect(self._on_server)
        self._proc.sig_finished.connect(self._on_finished)
        self.probe_button.clicked.connect(self.probe)
        self.servers.returnPressed.connect(self.probe)
        self.results: list[dict[str, Any]] = []

    def probe(self) -> None:
        text = self.servers.text().strip()
        self.table.setRowCount(0)
        self.results = []
        if not text:
            return
        self.status.setText(f"Asking {text} …")
        self.probe_button.setEnabled(False)
        self._proc.start(["rpc-probe", "--json", text])

    def _on_server(self, data: dict[str, Any]) -> None:
        self.results.append(data)
        rows = [(d["index"], f"{d['free'] / 2**20:,.0f} / {d['total'] / 2**20:,.0f} MiB free")
                for d in data.get("devices", [])] if data.get("status") == "ok" else [(None, data.get("message", ""))]
        for index, memory in rows:
            r = self.table.rowCount()
            self.table.insertRow(r)
            device = f"RPC{index}" if index is not None else data.get("status", "")
            for j, value in enumerate([data.get("endpoint", ""), device, memory]):
                self.table.setItem(r, j, QTableWidgetItem(value))

    def _on_finished(self, outcome: ProcessOutcome) -> None:
        self.probe_button.setEnabled(True)
        bad = [r for r in self.results if r.get("status") != "ok"]
        if not self.results:
            detail = outcome.last_line or str(outcome)
            self.status.setText(f"The probe gave no answer: {detail}")
        elif bad:
            self.status.setText(" ".join(r.get("message", "") for r in bad))
        else:
            n = sum(len(r.get("devices", [])) for r in self.results)
            self.status.setText(f"{len(self.results)} server(s), {n} device(s). Models load across them when "
                                "Preferences → Remote devices names them; the MTP head stays on this machine.")
