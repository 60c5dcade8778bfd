"""What one load will do, worked out once from the GGUF headers before llama.cpp
sees a file: the target's and the sidecar's facts, and whether MTP is prepared.

The worker makes the plan before it lets go of the loaded model (a bad file or
a mismatched sidecar must not leave the user with nothing loaded) and hands
the same plan to the session: each header is read, and the sidecar checked,
once per load. No llama.cpp here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

import engine.gguf.facts
from engine.errors import ModelFileError, ProjectorError, SpeculativeUnavailable
from engine.gguf import sidecar
from engine.gguf.facts import GGUFFacts
from engine.load_options import LoadOptions, check_options
from engine.store.parallel_fit import AUTO, DeviceMemory, default_parallel


@dataclass(frozen=True)
class LoadPlan:
    """Attributes:
        options: as asked, with ``path`` the file that loads (the embedded default
            model's when none was named).
        facts: the target's header facts.
        sidecar_facts: the sidecar's, when one was named.
        mtp_in_target: the MTP head is in the target file (no sidecar).
        want_mtp: MTP will be prepared (asked for, and the files have a head that fits).
        mtp_unavailable_reason: why MTP was asked for and will not be prepared.
        parallel_auto: ``options.parallel`` was 0 and is now what fits in memory (at most 4).
    """

    options: LoadOptions
    facts: GGUFFacts
    sidecar_facts: GGUFFacts | None
    mtp_in_target: bool
    want_mtp: bool
    mtp_unavailable_reason: str | None
    # the sequences were chosen by what fits (LoadOptions.parallel 0): a load that fails with more than
    # one may be tried with one (the estimate may be wrong); ``parallel_reason`` says why that many
    parallel_auto: bool = False
    parallel_reason: str = ""
    # the GPU memory the load offloads into (device_memory), asked once: the sequences that fit and the
    # state cache's budget both depend on it
    device: DeviceMemory | None = None

    @property
    def path(self) -> str:
        assert self.options.path is not None
        return self.options.path

    @property
    def file_bytes(self) -> int:
        """The bytes of the files that load (every shard of a split target, and the sidecar)."""
        paths = engine.gguf.facts.shard_paths(Path(self.path), self.facts.split_count)
        if self.options.sidecar:
            paths.append(Path(self.options.sidecar))
        total = 0
        for p in paths:
            with contextlib.suppress(OSError):
                total += p.stat().st_size
        return total

    def host_read_bytes(self) -> int:
        """The bytes of the files the CPU keeps reading as it decodes, mapped: all of them, less the share
        of layers offloaded to a GPU (read once, to upload them; their pages cost nothing to drop). The
        system counts mapped pages among the memory it could free; dropping these, the model would be
        read from disk again as it decodes. Called in the worker (it asks the backend for GPUs)."""
        return int(self.file_bytes * (1.0 - (self.device.share if self.device is not None else 0.0)))

    @classmethod
    def read(cls, options: LoadOptions) -> LoadPlan:
        """Check the settings, read the headers and check the head against the target.

        Raises:
            ContextError: a thread count or context size llama.cpp would refuse.
            ModelFileError: a file that cannot be opened or is not a GGUF model.
            SidecarMismatch: the sidecar named was made for another model (it was
                asked for explicitly, so this is an error, not a plain load).
            ProjectorError: the projector named is not one, or does not fit the target.
        """
        check_options(options)
        if options.path is None:
            from engine import default_model

            options = replace(options, path=str(default_model.default_model_path()))
        assert options.path is not None
        facts = read_facts(options.path)
        sidecar_facts = read_facts(options.sidecar) if options.sidecar else None
        want_mtp = options.mtp or options.sidecar is not None
        mtp_in_target = False
        reason = None
        if want_mtp:
            try:
                if sidecar_facts is not None:
                    sidecar.check_sidecar(facts, sidecar_facts)
                else:
                    sidecar.check_target_has_mtp(facts)
                    mtp_in_target = True
            except SpeculativeUnavailable as exc:  # the model loads without MTP and says why
                reason = str(exc)
                want_mtp = False
        if options.mmproj:
            check_projector(options.path, options.mmproj)
        parallel_auto, why = options.parallel == AUTO, ""
        device = device_memory(options, facts)
        if parallel_auto:
            n, why = default_parallel(options.path, n_ctx=options.n_ctx or facts.context_length,
                                      sidecar=options.sidecar, device=device, swa_full=options.swa_full,
                                      kv_unified=options.kv_unified)
            options = replace(options, parallel=n)
        return cls(options, facts, sidecar_facts, mtp_in_target, want_mtp, reason, parallel_auto, why, device)


def device_memory(options: LoadOptions, facts: GGUFFacts) -> DeviceMemory | None:
    """The GPU memory a load with ``options`` offloads into, as the engine's backend registry reports it free
    now (None: nothing offloaded, no GPU, or a split over RPC servers, whose memory this machine cannot see).
    Called in the worker, the one process that loads llama.cpp."""
    if options.n_gpu_layers == 0 or options.rpc:
        return None
    from engine.hardware.probe import engine_devices

    try:
        gpus = [d for d in engine_devices()[0] if d.is_gpu]
    except (OSError, AttributeError):  # an engine without ggml's device API: RAM only, as before
        return None
    if options.main_device is not None and 0 <= options.main_device < len(gpus):
        gpus = [gpus[options.main_device]]
    if not gpus or sum(d.free_mib for d in gpus) <= 0:
        return None
    layers = facts.block_count + 1  # llama.cpp counts the output layer as one more
    share = 1.0 if options.n_gpu_layers < 0 else min(1.0, options.n_gpu_layers / layers)
    return DeviceMemory(free=sum(d.free_mib for d in gpus) * 2**20, share=share,
                        name=gpus[0].description or gpus[0].name if len(gpus) == 1 else f"{len(gpus)} GPUs")


def check_projector(target: str, mmproj: str) -> None:
    """Refuse a projector that is not one, or does not fit the target, from both headers (the doctor's
    findings), before the loaded model is let go of.

    Raises:
        ProjectorError: naming what does not fit.
    """
    from engine.store.projectors import diagnose_projector

    try:
        diagnosis = diagnose_projector(target, mmproj)
    except ModelFileError as exc:
        raise ProjectorError(str(exc)) from None
    except OSError as exc:
        raise ProjectorError(f"Cannot open the projector {mmproj}: {exc.strerror or exc}.") from None
    if not diagnosis.ok:
        errors = [f.text for f in diagnosis.findings if f.severity == "error"]
        raise ProjectorError(f"{diagnosis.verdict()} {' '.join(errors)}")


def read_facts(path: str | Path) -> GGUFFacts:
    """The file's header facts; a path the system refuses (too long, a directory, no
    permission) is a ``model_file`` error, not a bug."""
    try:
        return engine.gguf.facts.read_facts(path)  # looked up when called: tests count the reads
    except ModelFileError:
        raise
    except OSError as exc:
        text = str(path)
        shown = text if len(text) <= 200 else f"{text[:200]}… ({len(text):,} characters)"
        raise ModelFileError(f"Cannot open {shown}: {exc.strerror or exc}. Choose a GGUF file you can read.") from None
