"""Run score.py in vLLM's environment, keeping what vLLM returned (tests/test_vllm.py).

    .venv-vllm/bin/python tests/vllm_raw.py RAW.json score.py-arguments...

runs `score.main(arguments)` with the vLLM engine's reading of each finished request wrapped:
every prompt's decoded tokens and, per decode step, every entry vLLM returned (id, raw
log-probability, rank) are written to RAW.json, so that the test compares the trace's rows with
vLLM's own output rather than with the engine's reading of it.
"""

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import score
from scoring.engines import vllm

raw, argv = Path(sys.argv[1]), sys.argv[2:]
kept = {}
read = vllm.VLLM.scores


def scores(self, job, out, k):
    kept[job.index] = dict(
        tokens=[int(t) for t in out.token_ids],
        steps=[[[int(i), float(v.logprob), int(v.rank)] for i, v in step.items()]
               for step in out.logprobs],
    )  # fmt: skip
    return read(self, job, out, k)


vllm.VLLM.scores = scores
code = score.main(argv)
raw.write_bytes(orjson.dumps({str(i): v for i, v in sorted(kept.items())}))
sys.exit(code)
