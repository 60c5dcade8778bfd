"""Seeds of the parallel campaign (scripts/parallel_sweep.py) that caught a defect, kept as tests.

The campaign draws schedules of conversations joining, continuing and ending on four sequences and
checks every reply against plain decoding. Step 3.5's seeds 1 and 7 with 16-token prompt chunks
parted replies far beyond noise (top-2 margins up to 1.6) once prompt chunks shared the verify decode
on a sliding-window model, while llama.cpp split that decode into ubatches; one ubatch per decode
(ParallelGenerator.decode_rows, a ubatch the session sizes to hold every verify row and a chunk
beside them) keeps them plain decoding's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "parallel_sweep.py"


def sweep():
    spec = importlib.util.spec_from_file_location("parallel_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [1, 7])
def test_step35_with_small_prompt_chunks_sharing_the_verify_decode_stays_plain_decoding(seed):
    replies, _near, _drafts, defects = sweep().run("step35", seed, n_batch=16)
    assert replies == 12
    assert defects == []


def test_a_decode_holds_every_sequences_verify_rows_and_a_chunk_beside_them_in_one_ubatch():
    """With 4-token prompt chunks a ubatch was 4 rows: the verify rows of the sequences running split
    over ubatches, and a newcomer's chunk found no room beside them while they drafted."""
    from engine.generation.parallel import MAX_DRAFT, ParallelGenerator
    from engine.generation.session import LoadOptions, Session
    from tests.engine.conftest import synth

    path = str(synth("step35", "mixed", agree=0.7, reads="hidden").path())
    with Session(LoadOptions(path=path, n_ctx=256, parallel=4, n_batch=4)) as session:
        engine = ParallelGenerator(session)
        assert engine.decode_rows >= 4 * (MAX_DRAFT + 1)
        assert engine.prefill_chunk == 4  # the chunk itself stays what was asked
