"""The model manager page: search the hub, pick a quantization, download with
progress; the library on disk with each model's facts; the sidecar doctor,
repair, and memory fit."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import background
from app.catalog_view import RecommendedModels
from app.pair_proof import PairProof
from engine import paths
from engine.store import catalog, credentials, fit, hub, library
from engine.store.doctor import Diagnosis, diagnose, run_probe
from engine.store.download import Progress, download


def _facts_lines(path: str, n_ctx: int) -> list[str]:
    """A model's header facts and its memory estimate at ``n_ctx``, as lines (or why not)."""
    from engine.gguf.facts import read_facts

    try:
        lines = read_facts(path).summary_lines()
        est = fit.estimate(path, n_ctx=n_ctx)
        return [*lines, "", f"memory at n_ctx {n_ctx}:", *("  " + ln for ln in est.lines())]
    except Exception as exc:
        return [str(exc)]


class DownloadRow(QWidget):
    """One queued download: name, progress, speed, cancel."""

    def __init__(self, repo: str, filename: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.repo, self.filename = repo, filename
        self.cancel_event = threading.Event()
        self.task: background.Task | None = None
        self.label = QLabel(filename)
        self.bar = QProgressBar()
        self.speed = QLabel("queued")
        self.cancel = QPushButton("Cancel")
        self.cancel.clicked.connect(self.cancel_event.set)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 2)
        row.addWidget(self.bar, 3)
        row.addWidget(self.speed, 2)
        row.addWidget(self.cancel)

    def show_progress(self, p: Progress) -> None:
        self.bar.setRange(0, 1000)
        self.bar.setValue(int(1000 * p.done / p.total) if p.total else 0)
        resumed = f", resumed at {p.resumed_from / 2**20:.0f} MiB" if p.resumed_from else ""
        self.speed.setText(f"{p.done / 2**20:.0f}/{p.total / 2**20:.0f} MiB, "
                           f"{p.bytes_per_s / 2**20:.1f} MiB/s{resumed}")


class ModelsPage(QWidget):
    """Signals:
        sig_use_model(str, str): load this target (and sidecar path, or "") in the chat.
    """

    sig_use_model = Signal(str, str)

    def __init__(self, parent: QWidget | None = None, n_ctx: int = 8192) -> None:
        super().__init__(parent)
        self._n_ctx = n_ctx if n_ctx > 0 else 8192  # 0 in the settings: "the model's own"; no header read yet
        self._tasks: list[background.Task] = []
        self._scan_generation = 0
        self._facts_generation = 0
        self._proof: PairProof | None = None
        self._active_downloads: dict[tuple[str, str], DownloadRow] = {}  # (repo, file) -> its running row
        self._build()

    def follow_chat_context(self, n_ctx: int) -> None:
        """Estimate memory at the context the chat actually uses (called when the chat's context changes)."""
        if n_ctx > 0 and n_ctx != self.ctx.value():
            self.ctx.setValue(n_ctx)

    # -- layout ---------------------------------------------------------------
    def _build(self) -> None:
        self.recommended = RecommendedModels()
        self.recommended.sig_download.connect(self.download_recommended)
        hub_box = QGroupBox("Hugging Face")
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search GGUF models, e.g. Qwen3.6 MTP")
        self.search_button = QPushButton("Search")
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("Access token (kept in the system keyring)")
        save_token = QPushButton("Save token")
        save_token.clicked.connect(self._save_token)
        self.results = QListWidget()
        self.files = QTableWidget(0, 4)
        self.files.setHorizontalHeaderLabels(["Quantization", "Size", "Kind", "Files"])
        self.files.horizontalHeader().setStretchLastSection(True)
        self.files.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.sidecar_hint = QLabel()
        self.sidecar_hint.setWordWrap(True)
        self.download_button = QPushButton("Download selected")
        self.downloads = QVBoxLayout()
        top = QHBoxLayout()
        top.addWidget(self.query, 1)
        top.addWidget(self.search_button)
        tok = QHBoxLayout()
        tok.addWidget(self.token, 1)
        tok.addWidget(save_token)
        hub_col = QVBoxLayout(hub_box)
        hub_col.addLayout(top)
        hub_col.addLayout(tok)
        lists = QSplitter(Qt.Orientation.Horizontal)
        lists.addWidget(self.results)
        lists.addWidget(self.files)
        lists.setSizes([250, 450])
        hub_col.addWidget(lists, 1)
        hub_col.addWidget(self.sidecar_hint)
        hub_col.addWidget(self.download_button)
        hub_col.addLayout(self.downloads)

        lib_box = QGroupBox("On this computer")
        self.library = QListWidget()
        self.facts = QPlainTextEdit()
        self.facts.setReadOnly(True)
        add_folder = QPushButton("Add folder…")
        add_folder.clicked.connect(self._add_folder)
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(lambda: self.refresh_library())
        self.use_button = QPushButton("Use in chat")
        self.set_target = QPushButton("Set as target")
        self.set_sidecar = QPushButton("Set as sidecar")
        self.doctor_button = QPushButton("Check pair (doctor)")
        self.probe_check = QCheckBox("Live probe")
        self.probe_check.setToolTip("Also draft a few short replies with the pair (in a separate process) and "
                                    "report how many drafts the model accepts. Takes as long as loading the model.")
        self.repair_button = QPushButton("Repair sidecar")
        self.ctx = QSpinBox(minimum=256, maximum=1_048_576, singleStep=4096, value=self._n_ctx)
        self.ctx.setToolTip("The context the memory estimate assumes. It starts at the chat's context (the load "
                            "sheet's setting) and follows it; change it here to see what another size would need.")
        self.pair = QLabel("Target: –   Sidecar: –")
        self.pair.setWordWrap(True)
        self.use_repaired = QPushButton("Use repaired pair")
        self.use_repaired.setToolTip("Load the target with the repaired sidecar in the chat.")
        self.use_repaired.setVisible(False)
        self.use_repaired.clicked.connect(self._use_repaired)
        buttons = QHBoxLayout()
        for b in (add_folder, refresh, self.set_target, self.set_sidecar, self.use_button):
            buttons.addWidget(b)
        pair_row = QHBoxLayout()
        pair_row.addWidget(self.doctor_button)
        pair_row.addWidget(self.probe_check)
        pair_row.addWidget(self.repair_button)
        pair_row.addWidget(self.use_repaired)
        pair_row.addWidget(QLabel("Context"))
        pair_row.addWidget(self.ctx)
        pair_row.addStretch(1)
        lib_col = QVBoxLayout(lib_box)
        lib_split = QSplitter(Qt.Orientation.Horizontal)
        lib_split.addWidget(self.library)
        lib_split.addWidget(self.facts)
        lib_col.addWidget(lib_split, 1)
        lib_col.addLayout(buttons)
        lib_col.addWidget(self.pair)
        lib_col.addLayout(pair_row)

        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.recommended)
        split.addWidget(hub_box)
        split.addWidget(lib_box)
        QVBoxLayout(self).addWidget(split)

        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.results.currentItemChanged.connect(self._show_repo)
        self.download_button.clicked.connect(self.download_selected)
        self.library.currentItemChanged.connect(self._show_facts)
        self.set_target.clicked.connect(lambda: self._set_pair("target"))
        self.set_sidecar.clicked.connect(lambda: self._set_pair("sidecar"))
        self.doctor_button.clicked.connect(self.run_doctor)
        self.repair_button.clicked.connect(self.run_repair)
        self.use_button.clicked.connect(self._use)
        self.ctx.valueChanged.connect(lambda _v: self._show_facts(self.library.currentItem(), None))
        self.target_path: str | None = None
        self.sidecar_path: str | None = None
        self.repaired_pair: tuple[str, str] | None = None  # (target, repaired sidecar) after a proven repair
        self._groups: list[hub.FileGroup] = []
        self._catalog_shown = False

    def showEvent(self, event: object) -> None:  # noqa: N802 (Qt's name)
        """The recommendations and the connection probe, the first time the page is seen: not at app start,
        where a network probe would serve nobody."""
        if not self._catalog_shown:
            self.show_recommended()
        super().showEvent(event)

    def show_recommended(self) -> None:
        self._catalog_shown = True
        self.recommended.refresh()

    def _track(self, task: background.Task) -> background.Task:
        self._tasks.append(task)
        task.sig_done.connect(lambda _r: self._tasks.remove(task) if task in self._tasks else None)
        task.sig_failed.connect(lambda _r: self._tasks.remove(task) if task in self._tasks else None)
        return task

    # -- hub ------------------------------------------------------------------
    def search(self) -> None:
        query = self.query.text().strip()
        if not query:
            return
        self.results.clear()
        self.results.addItem("Searching…")
        # the token lookup may wait on the system keyring: never on the GUI thread
        task = self._track(background.run(lambda q: hub.search(q, 30, None, credentials.get_token()), query))
        task.sig_done.connect(self._show_results)
        task.sig_failed.connect(self._search_failed)

    def _search_failed(self, msg: str) -> None:
        if msg.startswith(hub.UNREACHABLE):
            self._message(self.results, "Offline: " + msg)
            self.recommended.set_offline("a search just found the hub out of reach.")
        else:
            self._message(self.results, f"Search failed: {msg}")

    def _message(self, widget: QListWidget, text: str) -> None:
        widget.clear()
        widget.addItem(text)

    def _show_results(self, repos: list[hub.RepoSummary]) -> None:
        self.results.clear()
        for r in repos:
            item = QListWidgetItem(f"{r.repo_id}  ·  {r.downloads} downloads")
            item.setData(Qt.ItemDataRole.UserRole, r.repo_id)
            self.results.addItem(item)
        if not repos:
            self.results.addItem("No GGUF repositories found.")

    def _show_repo(self, item: QListWidgetItem | None, _prev: object) -> None:
        repo = item.data(Qt.ItemDataRole.UserRole) if item else None
        if not repo:
            return
        self.files.setRowCount(0)
        task = self._track(background.run(lambda r: hub.repo_files(r, None, credentials.get_token()), repo))
        task.sig_done.connect(lambda groups: self._show_files(repo, groups))
        task.sig_failed.connect(lambda msg: self.sidecar_hint.setText(f"Could not list files: {msg}"))

    def _show_files(self, repo: str, groups: list[hub.FileGroup]) -> None:
        self._repo, self._groups = repo, groups
        self.files.setRowCount(len(groups))
        for i, g in enumerate(groups):
            values = [g.quant, f"{g.size / 2**30:.2f} GiB", "MTP sidecar" if g.is_mtp else
                      ("model" + (f", {g.shards} shards" if g.shards > 1 else "")), ", ".join(g.files)]
            for j, v in enumerate(values):
                self.files.setItem(i, j, QTableWidgetItem(v))
        side = hub.suggest_sidecar(repo, groups)
        self.sidecar_hint.setText(f"MTP sidecar for this model: {side[0]} — {side[1]}" if side
                                  else "No MTP sidecar known for this repository.")

    def download_selected(self) -> None:
        rows = sorted({i.row() for i in self.files.selectedIndexes()})
        for row in rows:
            for name in self._groups[row].files:  # every shard
                self._start_download(self._repo, name)

    def _start_download(self, repo: str, filename: str, on_done: Callable[[Path], None] | None = None,
                        on_failed: Callable[[str], None] | None = None) -> DownloadRow:
        """Start a download with its row, or, if that file is already downloading, point at its row: a second
        download of one file would only be refused by the engine's lock, with an error row to show for it."""
        key = (repo, filename)
        if key in self._active_downloads:
            self.sidecar_hint.setText(f"{filename} is already downloading (see its progress below).")
            running = self._active_downloads[key]
            if running.task is not None:  # a recommended pair waits on it too
                if on_done is not None:
                    running.task.sig_done.connect(on_done)
                if on_failed is not None:
                    running.task.sig_failed.connect(on_failed)
            return running
        row = DownloadRow(repo, filename)
        self._active_downloads[key] = row
        self.downloads.addWidget(row)
        dest = paths.data_dir() / "models" / repo.replace("/", "__")
        task = self._track(background.run(
            lambda r, f, d, report: download(r, f, d, token=credentials.get_token(), progress=report,
                                             cancel=row.cancel_event),
            repo, filename, dest, with_report=True))
        row.task = task
        task.sig_progress.connect(row.show_progress)
        task.sig_done.connect(lambda path: self._download_ended(key, "done, verified", refresh=True))
        task.sig_failed.connect(lambda msg: self._download_ended(key, msg))
        if on_done is not None:
            task.sig_done.connect(on_done)
        if on_failed is not None:
            task.sig_failed.connect(on_failed)
        return row

    def download_recommended(self, rec: catalog.Recommendation) -> None:
        """Look the recommendation's files up on the hub (the quantization's shards and the sidecar), then
        download them all; when every one is verified, they become the pair below."""
        self.recommended.set_row_status(rec, "Looking up files…")
        task = self._track(background.run(lambda r: catalog.resolve(r, None, credentials.get_token()), rec))
        task.sig_done.connect(lambda resolved: self._download_resolved(rec, resolved))
        task.sig_failed.connect(lambda msg: self._recommended_failed(rec, msg))

    def _recommended_failed(self, rec: catalog.Recommendation, msg: str) -> None:
        self.recommended.set_row_status(rec, "Download model + sidecar" if rec.sidecar else "Download")
        if msg.startswith(hub.UNREACHABLE):
            self.recommended.set_offline(f"{rec.repo} cannot be downloaded now.")
        else:
            self.recommended.status.setText(msg)

    def _download_resolved(self, rec: catalog.Recommendation, resolved: catalog.Resolved) -> None:
        self.recommended.set_row_status(rec, "Downloading…", size=resolved.size)
        done: dict[tuple[str, str], Path] = {}
        targets = [(r, f) for r, f, _s in resolved.target]
        sidecars = [(r, f) for r, f, _s in resolved.sidecar]

        def finished(key: tuple[str, str], path: Path) -> None:
            done[key] = Path(path)
            if len(done) == len(resolved.files):
                self._recommended_downloaded(rec, done[targets[0]], done[sidecars[0]] if sidecars else None)

        for repo, name in resolved.files:
            self._start_download(repo, name, on_done=lambda path, k=(repo, name): finished(k, path),
                                 on_failed=lambda _msg: self.recommended.set_row_status(rec, "Download again"))

    def _recommended_downloaded(self, rec: catalog.Recommendation, target: Path, sidecar: Path | None) -> None:
        self.target_path, self.sidecar_path = str(target), str(sidecar) if sidecar else None
        self._show_pair()
        self.recommended.set_row_status(rec, "Downloaded")
        self.recommended.status.setText(
            f"{rec.name} is downloaded and set as the pair below. Check pair (doctor) to confirm the sidecar "
            "fits, then Use in chat." if sidecar else
            f"{rec.name} is downloaded and set as the target below (its MTP head is in the file): Use in chat.")

    def _download_ended(self, key: tuple[str, str], text: str, refresh: bool = False) -> None:
        row = self._active_downloads.pop(key)
        row.speed.setText(text)
        row.cancel.setEnabled(False)
        if refresh:
            self.refresh_library()

    def _save_token(self) -> None:
        token = self.token.text().strip()
        if token:
            self.token.clear()
            # the keyring may wait on a desktop service: never on the GUI thread
            task = self._track(background.run(credentials.set_token, token))
            task.sig_done.connect(lambda saved: self.token.setPlaceholderText(
                "Token saved in the keyring" if saved else
                "No keyring on this system: set HF_TOKEN in the environment instead"))

    # -- library ----------------------------------------------------------------
    def refresh_library(self, select: str | None = None) -> None:
        """Rescan the library; ``select`` (a path) becomes the selected row, else the selection is kept."""
        self._scan_generation += 1
        generation = self._scan_generation
        task = self._track(background.run(library.scan))
        task.sig_done.connect(lambda entries: self._show_library(entries, generation, select))

    def _show_library(self, entries: list[library.LibraryEntry], generation: int,
                      select: str | None = None) -> None:
        """Rebuild the list without signals: a rebuild changes the current row, and reading that row's facts
        would overwrite what the panel shows (a repair's result, the doctor's report)."""
        if generation != self._scan_generation:
            return  # a newer scan is under way; scans may finish out of order
        keep = select or self._selected_path()
        with QSignalBlocker(self.library):
            self.library.clear()
            for e in entries:
                label = e.path.name + (f"  ·  {e.facts.architecture}, MTP {e.facts.nextn_layers} ({e.layout})"
                                       if e.facts else "  ·  unreadable")
                item = QListWidgetItem(label)
                item.setData(Qt.ItemDataRole.UserRole, str(e.path))
                item.setToolTip(str(e.path) if e.facts else e.problem or "")
                self.library.addItem(item)
                if keep and str(e.path) == keep:  # strings: no filesystem call per row on the GUI thread
                    self.library.setCurrentItem(item)

    def _selected_path(self) -> str | None:
        item = self.library.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def _show_facts(self, item: QListWidgetItem | None, _prev: object) -> None:
        """Header facts and the memory fit, read on the background runner (a
        spin of the context box must not read a header on the GUI thread)."""
        path = item.data(Qt.ItemDataRole.UserRole) if item else None
        if not path:
            return
        self._facts_generation += 1
        generation = self._facts_generation
        task = self._track(background.run(_facts_lines, path, self.ctx.value()))
        task.sig_done.connect(lambda lines: self._show_facts_lines(lines, generation))

    def _show_facts_lines(self, lines: list[str], generation: int) -> None:
        if generation == self._facts_generation:  # a newer read is under way otherwise
            self.facts.setPlainText("\n".join(lines))

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            library.add_folder(folder)
            self.refresh_library()

    def _set_pair(self, which: str) -> None:
        path = self._selected_path()
        if path:
            setattr(self, f"{which}_path", path)
            self._show_pair()

    def _show_pair(self) -> None:
        """The pair label names the files in use: after a repair, the repaired copy, never the broken one."""
        repaired = self.repaired_pair is not None and self.repaired_pair == (self.target_path, self.sidecar_path)
        self.pair.setText(f"Target: {Path(self.target_path).name if self.target_path else '–'}   "
                          f"Sidecar: {Path(self.sidecar_path).name if self.sidecar_path else '–'}"
                          + ("  (repaired copy)" if repaired else ""))
        self.use_repaired.setVisible(repaired)

    def run_doctor(self) -> None:
        if not (self.target_path and self.sidecar_path):
            self.facts.setPlainText("Choose a target and a sidecar first (Set as target / Set as sidecar).")
            return
        # headers only, but a header on a slow or network disk still waits: not on the GUI thread
        self._facts_generation += 1  # the panel now shows the doctor: drop a facts read still under way
        task = self._track(background.run(diagnose, self.target_path, self.sidecar_path))
        task.sig_done.connect(self._diagnosed)
        task.sig_failed.connect(self.facts.setPlainText)

    def _diagnosed(self, d: Diagnosis) -> None:
        self.facts.setPlainText(d.report())
        if self.probe_check.isChecked():
            self._probe(d)

    def _probe(self, d: Diagnosis) -> None:
        """The live probe loads the pair in a child process; waiting for it happens on a pool thread."""
        self.facts.setPlainText(d.report() + "\n\nLive probe: drafting a few short replies with the pair…")
        self.doctor_button.setEnabled(False)
        task = self._track(background.run(run_probe, d))
        task.sig_done.connect(lambda probed: self._probe_finished(probed.report()))
        task.sig_failed.connect(lambda msg: self._probe_finished(f"{d.report()}\n\nLive probe failed: {msg}"))

    def _probe_finished(self, text: str) -> None:
        self.facts.setPlainText(text)
        self.doctor_button.setEnabled(True)

    def run_repair(self) -> None:
        if not (self.target_path and self.sidecar_path):
            return
        from engine.store.repair import repair

        self._facts_generation += 1  # the panel now shows the repair: drop a facts read still under way
        self.facts.setPlainText("Repairing (streaming a corrected copy), then loading it in the engine…")
        target = self.target_path
        task = self._track(background.run(repair, target, self.sidecar_path))
        task.sig_done.connect(lambda out: self._prove(target, out))
        task.sig_failed.connect(lambda msg: self.facts.setPlainText(f"Repair failed: {msg}"))

    def _prove(self, target: str, out: Path) -> None:
        """Load the repaired pair in a worker of its own (app/pair_proof.py) and draft a few tokens."""
        if self._proof is not None:
            self._proof.stop()
            self._proof.deleteLater()
        self._proof = PairProof(self)
        self._proof.sig_proved.connect(lambda proof: self._repaired(target, out, proof))
        self._proof.sig_failed.connect(lambda msg: self.facts.setPlainText(f"Repair failed: {msg}"))
        self._proof.start(target, str(out))

    def _repaired(self, target: str, out: Path, proof: str) -> None:
        """Finish the job: the repaired copy becomes the sidecar (named in the pair label and selected in the
        library), the result stays on screen, and one click loads the repaired pair."""
        self.target_path, self.sidecar_path = target, str(out)
        self.repaired_pair = (target, str(out))
        self._show_pair()
        self.facts.setPlainText(f"Repaired: wrote {out}\n{proof}\nThe repaired copy is now the sidecar of the "
                                "pair. Use repaired pair loads it in the chat.")
        self.refresh_library(select=str(out))

    def _use_repaired(self) -> None:
        if self.repaired_pair:
            self.target_path, self.sidecar_path = self.repaired_pair
            self._show_pair()
            self.sig_use_model.emit(*self.repaired_pair)

    def _use(self) -> None:
        path = self.target_path or self._selected_path()
        if path:
            self.sig_use_model.emit(path, self.sidecar_path or "")

    def shutdown(self) -> None:
        if self._proof is not None:
            self._proof.stop()
        for i in range(self.downloads.count()):
            widget = self.downloads.itemAt(i).widget()
            if isinstance(widget, DownloadRow):
                widget.cancel_event.set()
