"""Hugging Face transformers in-process: the reference engine (it can sample), and a candidate.

Prefill in chunks through the model's cache (KV cache and recurrent state), then one token at a
time through the same cache, so decode runs the model's own decode path. After every forward the
cache can be stored at a lower precision (`kv_dtype`, `state_dtype`): what an engine that keeps
its state that way would see.
"""

import inspect
import math
from pathlib import Path

import numpy as np

from scoring.engines import Stepwise, package, sample, sampled_top_k, top_k
from scoring.trace import ScoreError

STATE_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
DTYPES = ("float32", "bfloat16", "float16", "float64")  # what a model computes in (--dtype)


class Transformers(Stepwise):
    """The model in `model` (a directory or Hub id) on `device` in `dtype`. Only the last
    position's logits of a prefill are computed; rows stay on the device (`top` reduces them
    there). Through --set, transformers' own loading options for a box of several devices:
    `device_map` (instead of --device: "auto", a device, or {module: device}), `max_memory`
    ({device: "80GiB"}, with device_map) and `attn_implementation` ("eager", "sdpa", ...)."""

    FLAGS = ("device", "dtype", "chunk", "kv_dtype", "state_dtype")

    def __init__(self, model, device=None, dtype="float32", chunk=512, kv_dtype="float32",
                 state_dtype="float32", device_map=None, max_memory=None,
                 attn_implementation=None):  # fmt: skip
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        # its notes on kernels it falls back from, and its loading bars, are not ours to print
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

        self.torch = torch
        if device is not None and device_map is not None:
            raise ScoreError("--device and --set device_map both place the model: give one")
        if max_memory is not None and device_map is None:
            raise ScoreError('--set max_memory needs --set device_map ("auto", or a map)')
        if not isinstance(chunk, int) or chunk < 1:
            raise ScoreError("--chunk must be at least 1")
        device = device or ("cpu" if device_map is None else None)
        self.device, self.dtype, self.chunk = device, dtype, chunk
        self.kv_dtype, self.state_dtype = kv_dtype, state_dtype
        if dtype not in DTYPES:
            raise ScoreError(f"--dtype {dtype}: not a dtype a model computes in here "
                             f"({', '.join(DTYPES)})")  # fmt: skip
        if device is not None:
            usable(torch, device)
        if Path(model).is_file():
            raise ScoreError(f"--model {model} is a file; transformers loads a model directory "
                             "or a Hub id (a GGUF file is --engine llama.cpp's)")  # fmt: skip
        if isinstance(
            max_memory, dict
        ):  # JSON keys are text: a GPU's number is an int to accelerate
            max_memory = {int(k) if str(k).isdigit() else k: v for k, v in max_memory.items()}
        placing = {k: v for k, v in dict(device_map=device_map, max_memory=max_memory,
                                         attn_implementation=attn_implementation).items()
                   if v is not None}  # fmt: skip
        try:
            model_ = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype),
                                                          **placing)  # fmt: skip
            self.model = (model_ if device is None else model_.to(device)).eval()
        except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
            raise ScoreError(f"--model {model}: transformers cannot load it"
                             + (f" with --set {', '.join(placing)}" if placing else "")
                             + f" ({one_line(e)})") from None  # fmt: skip
        self.placing, self.path = placing, model
        self.cache = None
        # transformers 5.24 (the score extra's) names the cache argument `cache`; earlier releases
        # (vLLM's environment holds 5.19) name it `past_key_values` and take any other keyword
        # without a word, so a cache given under the other name is dropped and decode runs
        # without it. The name is read from the model's own forward.
        forward = inspect.signature(self.model.forward).parameters
        self.cache_keyword = "cache" if "cache" in forward else "past_key_values"

    def describe(self):
        placed = getattr(self.model, "hf_device_map", None)
        return dict(
            engine="transformers", model_class=type(self.model).__name__, device=self.device,
            dtype=self.dtype, chunk=self.chunk, kv_dtype=self.kv_dtype,
            state_dtype=self.state_dtype,
            attn_implementation=str(getattr(self.model.config, "_attn_implementation", None)),
            device_map=self.placing.get("device_map") if placed is None
            else {k: str(v) for k, v in placed.items()},  # as transformers placed it
            max_memory=None if "max_memory" not in self.placing else {
                str(k): str(v) for k, v in self.placing["max_memory"].items()},
            packages={p: package(p) for p in ("torch", "transformers", "numpy", "pyarrow")},
        )  # fmt: skip

    def vocab_size(self):
        return int(self.model.get_input_embeddings().num_embeddings)

    def vocabulary(self):
        return tokenizer_strings(self.path)

    def context(self):
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None

    def draw(self, row, k, u, never):
        # The sampler reads the row on the CPU; on a device the top-k is taken there (`top`).
        if row.device.type == "cpu":
            return sampled_top_k(plain(row), k, u, never)
        token = sample(plain(row.cpu()), u, never)
        return token, torch_top(row, k, token)

    def forward(self, ids):
        torch = self.torch
        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[None], device=self.model.device)
            out = self.model(input_ids=x, **{self.cache_keyword: self.cache}, use_cache=True,
                             logits_to_keep=1)  # fmt: skip
            self.store()
            return out.logits[0, -1]

    def prefill(self, ids):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.stored = {}
        for a in range(0, len(ids), self.chunk):
            row = self.forward(ids[a : a + self.chunk])
        if self.cache.get_seq_length() != len(ids):  # the model did not keep its cache: refused
            raise ScoreError(f"--model {self.path}: transformers {package('transformers')} kept "
                             f"{self.cache.get_seq_length()} of the {len(ids)} prompt tokens in "
                             "the cache it was given; decode would run without them")  # fmt: skip
        return row

    def step(self, token):
        return self.forward([token])

    def store(self):
        """Round every state tensor written since the last forward through the storage dtypes."""
        for i, layer in enumerate(self.cache.layers):
            if hasattr(layer, "recurrent_states"):
                if self.state_dtype != "float32":
                    for states in (layer.conv_states, layer.recurrent_states):
                        for t in states.values():
                            if t is not None:
                                self.round(t, self.state_dtype)
            elif self.kv_dtype != "float32" and getattr(layer, "keys", None) is not None:
                a = self.stored.get(i, 0)  # KV entries are written once: round only the new ones
                for t in (layer.keys, layer.values):
                    self.round(t[..., a:, :], self.kv_dtype)
                self.stored[i] = layer.keys.shape[-2]

    def round(self, t, dtype):
        t.copy_(t.to(getattr(self.torch, dtype)).to(t.dtype))

    def top(self, row, k, next_id=None):
        # On the CPU the row is already where numpy reads it, and its top_k costs a quarter of
        # torch's here (docs/performance.md "Engines"); on a device only k values leave it.
        if row.device.type == "cpu":
            return top_k(plain(row), k, next_id)
        return torch_top(row, k, next_id)

    def at(self, row, ids):
        torch = self.torch
        lp = torch.log_softmax(row.double(), -1)
        return (
            lp[torch.as_tensor(np.asarray(ids), dtype=torch.long, device=lp.device)].cpu().numpy()
        )


def tokenizer_strings(path):
    """The token strings, in id order, of the Hugging Face tokenizer in a model directory (or
    Hub id); None where there is none."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError):  # a model without a tokenizer beside it
        return None
    return tok.convert_ids_to_tokens(list(range(len(tok))))


def plain(row):
    """A CPU logits row as numpy reads it: float32 and float64 as they are, bfloat16 and float16
    made float32 (exactly; numpy has no bfloat16). The shared functions compute in float64."""
    import torch

    return (row if row.dtype in (torch.float32, torch.float64) else row.float()).numpy()


def one_line(e):
    """An exception's first line (transformers' messages run to paragraphs)."""
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def usable(torch, device):
    """Refuse a --device torch does not know, or cannot use in this build and machine (cuda on
    a CPU build), before the model is loaded."""
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ScoreError(f"--device {device}: not a torch device ({e})") from None
    if d.type == "meta":
        raise ScoreError(f"--device {device}: a device that holds no values; name one that "
                         "computes (cpu, cuda, ...)")  # fmt: skip
    try:
        torch.empty(1, device=d)
    except (RuntimeError, AssertionError, ValueError, NotImplementedError) as e:  # torch's ways
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ScoreError(
            f"--device {device}: not available to torch {torch.__version__} here ({first})"
        ) from None


def torch_top(row, k, next_id=None):
    """Log-softmax in float64 of a logits row; the top-k ids (ties to the lower id) with their
    log-probabilities and the log-probability of `next_id`. Only these values leave the device."""
    import torch

    lp = torch.log_softmax(row.double(), -1)
    key = torch.nan_to_num(lp, nan=-math.inf)
    k = min(k, key.numel())
    kth = torch.topk(key, k).values[-1]
    near = torch.nonzero(key >= kth).reshape(-1)  # every id tied with the k-th too, ascending
    order = torch.sort(key[near], descending=True, stable=True).indices[:k]
    ids = near[order]
    fed = lp[next_id].item() if next_id is not None else math.nan
    return ids.cpu().numpy().astype(np.int32), lp[ids].cpu().numpy(), fed
