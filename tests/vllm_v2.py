"""SampleTokensV2 called as Model Runner V2 calls it, in vLLM's environment (tests/test_vllm.py).

    .venv-vllm/bin/python tests/vllm_v2.py

Model Runner V2 needs Triton, which vLLM's CPU backend lacks, so no V2 engine runs here. This
drives the processor through V2's own request-admission and per-step calls (vLLM's
SamplingParams and LogitsContext), on a batch of three rows: one of a request it samples, one of
a request it leaves alone, one of its request's partial prefill; then later steps, one of eight
sampled rows drawn together. Each row it
samples must hold only `scoring.engines.sample` of the row it was given, at the uniform of the
row's output step; the others must be untouched. Prints `ok`.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

from scoring.engines import sample, uniforms
from scoring.engines.vllm_processors import SAMPLE_KEY, SampleTokensV2

VOCAB, NEVER = 64, [3, 7]
# per request slot, as V2's request state holds it; slots 4 to 11 make a larger batch
prompt_len = np.array([5, 9, 7, 0] + [3] * 8, np.int32)
processor = SampleTokensV2(None, SimpleNamespace(prompt_len=SimpleNamespace(np=prompt_len)))
SAMPLED = (0, 1, *range(4, 12))
u = {slot: uniforms(0, f"row-{slot}", 6).tolist() for slot in SAMPLED}
for slot in SAMPLED:
    params = SamplingParams(max_tokens=6, extra_args={SAMPLE_KEY: {"u": u[slot], "never": NEVER}})
    SampleTokensV2.validate_params(params)
    assert processor.add_request(slot, params)
assert not processor.add_request(2, SamplingParams(max_tokens=6))


def step(slots, pos):
    """One step's rows (slot, position) through apply(); the rows given and returned."""
    logits = torch.randn(len(slots), VOCAB, generator=torch.Generator().manual_seed(len(pos)))
    logits = logits * 4
    given = logits.clone()
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(slots), idx_mapping=torch.tensor(slots),
        idx_mapping_np=np.array(slots), expanded_local_pos=torch.zeros(len(slots), dtype=torch.long),
        input_ids=torch.zeros(len(slots), dtype=torch.long), pos=torch.tensor(pos),
        seq_lens_upper_bound_np=np.array(pos) + 1,
    )  # fmt: skip
    return given, processor.apply(logits, ctx)


def only(row, token):
    return bool(row[token] == 0) and bool(torch.isneginf(row).sum() == VOCAB - 1)


# slot 1's first output step (its prompt's last position, 8), slot 2 (not sampled), and slot 0
# still in prefill (position 2 of a prompt of 5)
given, got = step([1, 2, 0], [8, 20, 2])
assert only(got[0], sample(given[0].numpy(), u[1][0], NEVER))
assert torch.equal(got[1], given[1]) and torch.equal(got[2], given[2])
# a later step: slot 0's output step 3 (position 7), slot 1's 2 (position 10)
given, got = step([0, 1], [7, 10])
assert only(got[0], sample(given[0].numpy(), u[0][3], NEVER))
assert only(got[1], sample(given[1].numpy(), u[1][2], NEVER))
# a batch of eight sampled rows and one left alone, drawn together (on several threads)
slots = [*range(4, 12), 2]
given, got = step(slots, [3 + i % 4 for i in range(8)] + [20])
for r, slot in enumerate(slots[:8]):
    assert only(got[r], sample(given[r].numpy(), u[slot][1 + r % 4], NEVER)), r
assert torch.equal(got[8], given[8])
try:
    SampleTokensV2.validate_params(SamplingParams(extra_args={SAMPLE_KEY: {"u": [1.5]}}))
    sys.exit("a malformed request was admitted")
except ValueError:
    pass
print("ok")
