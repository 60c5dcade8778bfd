"""Does an MTP source fit a target? Checked from GGUF metadata, before any
native load, because llama.cpp only asserts (aborting the process) on a
mismatch, or does not check at all (vocabulary)."""

from __future__ import annotations

import re

from engine.errors import SidecarMismatch, SpeculativeUnavailable
from engine.gguf_info import GGUFFacts

# Architectures whose llama.cpp graph runs an MTP head (DECODER_MTP).
MTP_ARCHITECTURES = frozenset(
    {"qwen35", "qwen35moe", "qwen3next", "step35", "mimo2", "hy_v3", "glm4moe", "deepseek2",
     "deepseek32", "glm-dsa", "cohere2moe", "bailingmoe3", "nemotron_h_moe", "deepseek4"}
)


def check_target_has_mtp(target: GGUFFacts) -> None:
    """Raise SpeculativeUnavailable unless the target file itself carries MTP blocks."""
    if target.nextn_layers <= 0:
        raise SpeculativeUnavailable(
            f"{target.path.name} ({target.architecture}) has no MTP/NextN layers; "
            "decoding without speculation. Choose a model with an MTP head or add an MTP sidecar."
        )
    if target.architecture not in MTP_ARCHITECTURES:
        raise SpeculativeUnavailable(
            f"{target.architecture} declares {target.nextn_layers} NextN layer(s) but this engine "
            "has no MTP graph for that architecture; decoding without speculation."
        )
    if target.layout == "trunk-only":
        raise SpeculativeUnavailable(
            f"{target.path.name} is a trunk-only export (its MTP blocks were left out). "
            "Load it with its MTP sidecar (mtp-*.gguf)."
        )


def check_sidecar(target: GGUFFacts, sidecar: GGUFFacts) -> None:
    """Raise SidecarMismatch, stating both values, if ``sidecar`` cannot serve ``target``."""
    name = sidecar.path.name

    def mismatch(what: str, side: object, tgt: object, advice: str) -> SidecarMismatch:
        return SidecarMismatch(
            f"The MTP sidecar {name} was made for a model with {what} {side}; this target has "
            f"{what} {tgt}. {advice}"
        )

    get_matching = f"Download the sidecar made for {target.name or target.path.name}."
    if sidecar.nextn_layers <= 0:
        raise SidecarMismatch(f"{name} has no MTP/NextN layers; it is not an MTP sidecar.")
    if sidecar.architecture != target.architecture:
        raise mismatch("architecture", sidecar.architecture, target.architecture, get_matching)
    if sidecar.architecture not in MTP_ARCHITECTURES:
        raise SpeculativeUnavailable(f"This engine has no MTP graph for {sidecar.architecture}.")
    if sidecar.n_embd_out != target.n_embd_out:
        raise mismatch("hidden size (n_embd_out)", sidecar.n_embd_out, target.n_embd_out, get_matching)
    if sidecar.vocab_size != target.vocab_size:
        raise mismatch("a vocabulary of", sidecar.vocab_size, target.vocab_size, get_matching)
    if sidecar.token_list_sha256 != target.token_list_sha256:
        raise mismatch(
            "token list hash", sidecar.token_list_sha256[:12], target.token_list_sha256[:12], get_matching
        )
    target_trunk = target.block_count - target.nextn_layers
    if sidecar.trunk_layers != target_trunk:
        raise mismatch("trunk layers", sidecar.trunk_layers, target_trunk, get_matching)
    if sidecar.layout != "mtp-only" and sidecar.layout != "combined":
        raise SidecarMismatch(
            f"{name} declares {sidecar.nextn_layers} MTP layer(s) but holds no "
            f"blk.{sidecar.trunk_layers}.nextn.* tensors: its blocks are numbered for another "
            "convention (relative instead of absolute) or missing. Run Repair in the model manager."
        )
    _check_tensors(sidecar)


# Tensor names llama.cpp's loaders consume in an MTP sidecar. Anything else
# (typically the same weights again under a legacy exporter's name) makes the
# loader fail with "wrong number of tensors".
_EXPECTED = re.compile(
    r"^(token_embd|output_norm|output)\.weight$"
    r"|^blk\.\d+\.(attn_\w+|ffn_\w+|post_attention_norm|exp_probs_b|ssm_\w+"
    r"|nextn\.(eh_proj|enorm|hnorm|embed_tokens|shared_head_head|shared_head_norm))\.(weight|bias)$"
    r"|^blk\.\d+\.ssm_a$"
)


def unexpected_tensors(names: tuple[str, ...] | list[str]) -> list[str]:
    """Tensor names an MTP sidecar should not hold (see ``_EXPECTED``)."""
    return [n for n in names if not _EXPECTED.match(n)]


def _check_tensors(sidecar: GGUFFacts) -> None:
    """Every declared MTP block must hold the three tensors llama.cpp requires,
    once, and nothing the loader would not consume."""
    names = sidecar.tensor_names
    unexpected = unexpected_tensors(names)
    if unexpected:
        raise SidecarMismatch(
            f"{sidecar.path.name} holds {len(unexpected)} tensor(s) this engine's loader does not "
            f"expect, e.g. {', '.join(unexpected[:3])} — usually the same weights stored again under a "
            "legacy exporter's names. llama.cpp rejects the file ('wrong number of tensors'). Run Repair."
        )
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SidecarMismatch(f"{sidecar.path.name} holds duplicate tensors: {sorted(dupes)[:3]}. Run Repair.")
    present = set(names)
    for il in range(sidecar.trunk_layers, sidecar.block_count):
        for part in ("eh_proj", "enorm", "hnorm"):
            tensor = f"blk.{il}.nextn.{part}.weight"
            if tensor not in present:
                raise SidecarMismatch(
                    f"{sidecar.path.name} is missing tensor {tensor}; the export is incomplete. "
                    "Download it again or use another export."
                )
