"""This project's logits processors for vLLM (docs/scoring.md "vLLM"): a forced token, or the
project's own sample, left alone in a request's logits, so that greedy sampling takes it.

A vLLM server or an engine process of its own loads them by name (`--logits-processors
scoring.engines.vllm_processors:SampleTokens`): this module imports vLLM's two processor
interfaces, torch and scoring.engines only. A request opts in through SamplingParams.extra_args:
FORCE_KEY the tokens to force, SAMPLE_KEY {"u": the uniform of each decode step, "never": the ids
never sampled}; other requests are left alone.

What a processor sees (vLLM 0.32's V1 sampler and Model Runner V2's alike): the step's logits in
float32, the model's own values (upcast when the model computes in bf16), after vLLM's
allowed-ids mask, bad words, logit bias and min-tokens (penalties: before it on V2, after it on
V1), which this project's requests do not set, and after any processor installed as a plug-in
(docs/scoring.md "vLLM"); the raw log-probabilities vLLM returns (logprobs_mode "raw_logprobs")
are the float32 log-softmax of the same values, taken before any processor. So the token drawn
is `sample` of exactly the row whose log-softmax is recorded.
"""

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as LogitsProcessorV2

from scoring.engines import FORCE_KEY, FORCE_REFUSAL, sample

SAMPLE_KEY = "kern_prompts_sample"  # and of the sampler's uniforms and never-ids


def only(row, token):
    """The row with every value -inf but `token`'s, 0, in place (vLLM takes the row back). A row
    in the CPU's memory is written through numpy, without a torch operation a row."""
    if row.device.type == "cpu":
        x = row.numpy()
        x.fill(-math.inf)
        x[token] = 0.0
    else:
        row.fill_(-math.inf)
        row[token] = 0.0
    return row


def draw(row, u, never):
    """The project's sample from a logits row (a tensor on any device)."""
    return sample(row.detach().cpu().numpy(), u, never)


def forced(params):
    got = (params.extra_args or {}).get(FORCE_KEY)
    if got is not None and not (
        isinstance(got, list) and got and all(isinstance(t, int) for t in got)
    ):
        raise ValueError(FORCE_REFUSAL)
    return got


def sampling(params):
    """A request's (uniforms, never-ids), or None."""
    got = (params.extra_args or {}).get(SAMPLE_KEY)
    if got is None:
        return None
    u, never = (got.get("u"), got.get("never")) if isinstance(got, dict) else (None, None)
    if not (
        isinstance(u, list) and u and all(isinstance(x, float) and 0.0 <= x < 1.0 for x in u)
        and isinstance(never, list) and all(isinstance(t, int) for t in never)
    ):  # fmt: skip
        raise ValueError(
            f"extra_args[{SAMPLE_KEY!r}] must be {{'u': uniforms in [0, 1), 'never': [ids]}}"
        )
    return u, tuple(never)


class ForceTokens(AdapterLogitsProcessor):
    """Leaves only the forced token in each decode step's logits (per request, V1 runner)."""

    @classmethod
    def validate_params(cls, params):
        forced(params)

    def is_argmax_invariant(self):
        return False  # it changes the argmax: vLLM would skip it for greedy requests otherwise

    def new_req_logits_processor(self, params):
        tokens = forced(params)
        if not tokens:
            return None

        def force(output_ids, logits):
            return only(logits, tokens[min(len(output_ids), len(tokens) - 1)])

        return force


class SampleTokens(AdapterLogitsProcessor):
    """Leaves only the project's sample in each decode step's logits (per request, V1 runner):
    uniform j draws output token j. It keeps no state of its own, so a row vLLM computes and
    throws away (a prompt's partial prefill) changes nothing."""

    @classmethod
    def validate_params(cls, params):
        sampling(params)

    def is_argmax_invariant(self):
        return False

    def new_req_logits_processor(self, params):
        got = sampling(params)
        if got is None:
            return None
        u, never = got

        def choose(output_ids, logits):
            return only(logits, draw(logits, u[min(len(output_ids), len(u) - 1)], never))

        return choose


class SampleTokensV2(LogitsProcessorV2):
    """SampleTokens for Model Runner V2 (vLLM's default on GPUs), through V2's own processor
    interface: it runs once for the batch, on rows that map to request slots; a row's output step
    is its position less the prompt's last (a row before it is a partial prefill: left alone)."""

    def __init__(self, vllm_config, req_states):
        self.prompt_len = req_states.prompt_len.np  # the host copy, per slot
        self.slots = {}

    @classmethod
    def validate_params(cls, params):
        sampling(params)

    def add_request(self, req_idx, params):
        got = sampling(params)
        if got is None:
            self.slots.pop(req_idx, None)
            return False
        self.slots[req_idx] = got
        return True

    def apply(self, logits, ctx):
        if not self.slots:
            return logits
        slots = ctx.expanded_idx_mapping.tolist()
        rows = [r for r, s in enumerate(slots) if s in self.slots]
        if not rows:
            return logits
        pos = ctx.pos[rows].tolist()
        todo = []  # (row, uniform, never) of each row at an output step
        for r, p in zip(rows, pos):
            u, never = self.slots[slots[r]]
            j = p - int(self.prompt_len[slots[r]]) + 1
            if j >= 0:
                todo.append((r, u[min(j, len(u) - 1)], never))
        if not todo:
            return logits
        # The batch's rows come to the host in one copy and are drawn on several threads (numpy
        # lets them run; each draw is `sample` of its own row, whichever thread): at a batch of
        # 40, one row at a time costs tens of milliseconds a step, more than a GPU's decode.
        rows, us, nevers = (list(v) for v in zip(*todo))
        host = logits[rows].detach().cpu().numpy()
        tokens = list(drawing().map(sample, host, us, nevers))
        at = torch.tensor(rows, device=logits.device)
        logits.index_fill_(0, at, -math.inf)
        logits[at, torch.tensor(tokens, device=logits.device)] = 0.0
        return logits


@functools.cache
def drawing():
    """The threads SampleTokensV2 draws a batch's rows on (made once, at most 8)."""
    return ThreadPoolExecutor(min(8, os.cpu_count() or 1), "kern-draw")
