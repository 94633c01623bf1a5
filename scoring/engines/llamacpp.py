"""llama.cpp as a candidate: a GGUF model teacher-forced through llama.cpp's own decode, in this
process (docs/scoring.md "llama.cpp").

Driven through llama-cpp-python's low-level API (the C API of the llama.cpp it carries). Per
prompt the context's memory (KV cache and recurrent state) is cleared, tokens [0, ctx) are decoded
in batches of at most n_batch tokens (prefill: llama.cpp computes the logits of each batch's last
token only), then each next token is one llama_decode of one token (a real decode step). After
the prefill and after each step the last position's logits row (float32) is read and reduced by
`top_k`: log-softmax in float64, the top k with ties to the lower id, the fed token's
log-probability. Only that one row is ever computed: `Llama(logits_all=True)` would hold n_ctx
rows of Qwen's 248,320 logits (1 GB at 1024 tokens).

The context is made for the longest prompt of a call (its ctx + steps, rounded up to 256) unless
the setting n_ctx fixes it; its size does not change a number (4096 and 256 give the same bytes).
llama.cpp's log goes through a callback of this module: it is kept for error messages and printed
only with verbose=true.
"""

import ctypes
import os
import sys
from collections import deque
from pathlib import Path

import llama_cpp as L
import numpy as np

from scoring import builder as build
from scoring.engines import Engine, package, scores_of, top_k
from scoring.trace import ScoreError

CTX_ROUND = 256  # a context is made for ctx + steps rounded up to this
FLASH = {False: "LLAMA_FLASH_ATTN_TYPE_DISABLED", True: "LLAMA_FLASH_ATTN_TYPE_ENABLED",
         "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO"}  # fmt: skip


class _Log:
    """llama.cpp's log: the recent lines (for error messages), printed to stderr if verbose."""

    def __init__(self):
        self.lines = deque(maxlen=50)
        self.verbose = False
        self.part = ""

        @L.llama_log_callback
        def callback(level, text, user_data):
            t = text.decode("utf-8", "replace")
            if self.verbose:
                sys.stderr.write(t)
            self.part += t
            while "\n" in self.part:
                line, self.part = self.part.split("\n", 1)
                if line.strip():
                    self.lines.append(line.strip())

        self.callback = callback  # llama.cpp holds the pointer: keep the function alive
        L.llama_log_set(callback, ctypes.c_void_p(0))

    def last(self, n=3):
        return " | ".join(list(self.lines)[-n:]) or "no message from llama.cpp"


_LOG = None


def _log():
    global _LOG
    if _LOG is None:
        _LOG = _Log()
        L.llama_backend_init()
    return _LOG


def ggml_type(name, value):
    """A KV cache type given as a name ("f16", "q8_0", ...) or ggml's number: (number, name)."""
    names = {getattr(L, a): a.removeprefix("GGML_TYPE_").lower()
             for a in dir(L) if a.startswith("GGML_TYPE_") and a != "GGML_TYPE_COUNT"}  # fmt: skip
    if isinstance(value, str) and hasattr(L, "GGML_TYPE_" + value.upper()):
        return getattr(L, "GGML_TYPE_" + value.upper()), value.lower()
    if isinstance(value, int) and not isinstance(value, bool) and value in names:
        return value, names[value]
    raise ScoreError(f"--set {name}={value}: not a llama.cpp cache type (f16, bf16, f32, q8_0, "
                     "q4_0, ...)")  # fmt: skip


def ggml_build():
    """ggml's version and commit, from the library llama-cpp-python loaded."""
    lib = Path(L.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib / name).exists():
            try:
                g = ctypes.CDLL(str(lib / name))
                g.ggml_version.restype = g.ggml_commit.restype = ctypes.c_char_p
                return f"ggml {g.ggml_version().decode()} commit {g.ggml_commit().decode()}"
            except (OSError, AttributeError):
                break
    return None


class LlamaCpp(Engine):
    """A GGUF file in llama.cpp. The settings are llama.cpp's context and model parameters:
    n_threads (default: the machine's cores; n_threads_batch follows it unless given), n_batch
    (512) and n_ubatch (min(n_batch, 512)), type_k and type_v (the KV cache: llama.cpp's own
    default f16), flash_attn (false, true or "auto"), n_gpu_layers (0), n_ctx (default: made for
    each call's longest prompt; set, a prompt that does not fit is refused), verbose (llama.cpp's
    log on stderr)."""

    def __init__(self, model, n_threads=None, n_threads_batch=None, n_batch=512, n_ubatch=None,
                 type_k="f16", type_v="f16", flash_attn=False, n_gpu_layers=0, n_ctx=None,
                 verbose=False):  # fmt: skip
        path = Path(model)
        if not path.is_file():
            raise ScoreError(f"--model {model}: no such GGUF file (llama.cpp reads one .gguf file)")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ScoreError(f"--model {model}: not a GGUF file (it starts with {magic!r}, not "
                             "b'GGUF'); llama.cpp's convert_hf_to_gguf.py makes one")  # fmt: skip
        ints = dict(n_threads=n_threads, n_threads_batch=n_threads_batch, n_batch=n_batch,
                    n_ubatch=n_ubatch, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx)  # fmt: skip
        for name, v in ints.items():
            low = 0 if name == "n_gpu_layers" else 1
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise ScoreError(f"--set {name}={v}: must be an integer of at least {low}")
        if not (isinstance(flash_attn, bool) or flash_attn == "auto"):  # 1 == True: not a flag
            raise ScoreError(f'--set flash_attn={flash_attn}: must be false, true or "auto"')
        n_threads = n_threads or os.cpu_count() or 1
        # llama.cpp runs micro-batches of at most n_batch tokens: recorded as it runs them
        n_ubatch = min(n_ubatch or 512, n_batch)
        (k_type, k_name), (v_type, v_name) = (
            ggml_type("type_k", type_k),
            ggml_type("type_v", type_v),
        )
        self.path, self.log = path, _log()
        self.log.verbose = bool(verbose)
        self.settings = dict(
            n_threads=n_threads, n_threads_batch=n_threads_batch or n_threads, n_batch=n_batch,
            n_ubatch=n_ubatch, type_k=k_name, type_v=v_name, flash_attn=flash_attn,
            n_gpu_layers=n_gpu_layers, n_ctx=n_ctx,
        )  # fmt: skip
        self.sha256 = build.sha256_file(path)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        self.log.lines.clear()
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise ScoreError(f"llama.cpp could not load {model}: {self.log.last()}")
        self.n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model)))
        cp = L.llama_context_default_params()
        cp.n_threads, cp.n_threads_batch = n_threads, self.settings["n_threads_batch"]
        cp.type_k, cp.type_v = k_type, v_type
        cp.flash_attn_type = getattr(L, FLASH[flash_attn])
        cp.no_perf = True
        self.cparams, self.ctx, self.n_ctx = cp, None, 0
        if n_ctx:
            self.context(n_ctx)

    def vocab_size(self):
        return self.n_vocab

    def vocabulary(self):
        vocab = L.llama_model_get_vocab(self.model)
        return [L.llama_vocab_get_text(vocab, i).decode("utf-8", "replace")
                for i in range(self.n_vocab)]  # fmt: skip

    def meta(self, key):
        buf = ctypes.create_string_buffer(256)
        n = L.llama_model_meta_val_str(self.model, key.encode(), buf, 256)
        return buf.value.decode() if n >= 0 else None

    def describe(self):
        file_type = self.meta("general.file_type")
        names = {getattr(L, a): a.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_")
                 .removeprefix("ALL_") for a in dir(L) if a.startswith("LLAMA_FTYPE_")}  # fmt: skip
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, 256)
        return dict(
            engine="llama.cpp", llama_cpp=ggml_build(), llama_cpp_python=L.__version__,
            model=self.path.name, sha256=self.sha256,
            file_type=None if file_type is None else int(file_type),
            quantization=None if file_type is None else names.get(int(file_type), file_type),
            architecture=self.meta("general.architecture"), model_desc=desc.value.decode(),
            n_vocab=self.n_vocab,
            system_info=L.llama_print_system_info().decode().strip(),
            settings=dict(self.settings,
                          n_ctx=self.settings["n_ctx"] or f"each call's longest prompt, rounded "
                                                          f"up to {CTX_ROUND}"),
            packages={p: package(p) for p in ("llama-cpp-python", "numpy")},
        )  # fmt: skip

    def context(self, n_ctx):
        if self.ctx is not None:
            L.llama_free(self.ctx)
            self.ctx = None
        cp = self.cparams
        cp.n_ctx = n_ctx
        cp.n_batch = min(self.settings["n_batch"], n_ctx)
        cp.n_ubatch = min(self.settings["n_ubatch"], cp.n_batch)
        self.log.lines.clear()
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise ScoreError(f"llama.cpp could not make a context of {n_ctx} tokens: "
                             f"{self.log.last()}")  # fmt: skip
        self.n_ctx, self.n_batch = L.llama_n_ctx(self.ctx), L.llama_n_batch(self.ctx)
        self.memory = L.llama_get_memory(self.ctx)

    def decode(self, tokens, where):
        arr = (L.llama_token * len(tokens))(*map(int, tokens))
        self.log.lines.clear()
        rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise ScoreError(f"llama.cpp's decode returned {rc} at {where}: {self.log.last()}")

    def row(self):
        ptr = L.llama_get_logits_ith(self.ctx, -1)
        if not ptr:
            raise ScoreError(f"llama.cpp returned no logits: {self.log.last()}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def force(self, jobs, k, progress=lambda n: None):
        jobs = list(jobs)
        for job in jobs:  # every prompt checked before any forward
            s, tokens = job.schedule, job.tokens
            need = s.ctx + s.steps
            bad = np.flatnonzero((tokens[: need + 1] < 0) | (tokens[: need + 1] >= self.n_vocab))
            if len(bad):
                raise ScoreError(
                    f"prompt {job.index} position {bad[0]} holds token {tokens[bad[0]]}, outside "
                    f"the vocabulary of {self.path.name} ({self.n_vocab} ids): the corpus was "
                    "tokenized for another model"
                )
            if self.settings["n_ctx"] and need > self.settings["n_ctx"]:
                raise ScoreError(
                    f"--set n_ctx={self.settings['n_ctx']}: prompt {job.index} needs a context of "
                    f"{need} tokens (ctx {s.ctx} + steps {s.steps}); leave n_ctx unset and the "
                    "context is made to fit"
                )
        longest = max((j.schedule.ctx + j.schedule.steps for j in jobs), default=0)
        if longest > self.n_ctx:
            self.context(-(-longest // CTX_ROUND) * CTX_ROUND)
        for job in jobs:
            s, tokens = job.schedule, job.tokens
            L.llama_memory_clear(self.memory, True)
            for at in range(0, s.ctx, self.n_batch):
                self.decode(tokens[at : min(s.ctx, at + self.n_batch)],
                            f"prompt {job.index} prefill from {at}")  # fmt: skip
            got = []
            for pos in s.positions:
                if pos >= s.ctx:
                    self.decode(tokens[pos : pos + 1], f"prompt {job.index} position {pos}")
                got.append(top_k(self.row(), k, int(tokens[pos + 1])))
                progress(1)
            yield job.index, scores_of(s, got)

    def close(self):
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
            self.model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
