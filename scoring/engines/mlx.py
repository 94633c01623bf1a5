"""MLX as a candidate and as a reference: a model directory teacher-forced through mlx-lm's own
forward and prompt cache, or sampling its continuation, in this process (docs/scoring.md "MLX").

A `Stepwise` engine: forcing and sampling are the interface's. Per prompt a fresh prompt cache
(`mlx_lm.models.cache.make_prompt_cache`: KV caches, and the recurrent and convolution state of
gated-delta-rule layers) is made and the prompt is fed as mlx-lm's generation feeds it
(`mlx_lm.generate.generate_step`): every token but the last in pieces of `prefill_step_size`,
only the cache evaluated (MLX computes lazily, so no logits of those pieces are ever computed),
then the last token alone, whose logits row is the prefill's; then each next token is one forward
of one token on the same cache. The row is brought to numpy (float32; a bf16 or f16 row widened
exactly, and read in place) and reduced by the shared `top_k`, or drawn from by the shared
sampler.

The model directory is one `mlx_lm.convert` writes, or a Hugging Face one mlx-lm loads. The one
place a config as transformers writes it is mapped to what mlx-lm reads is `mlx_lm_config`.
"""

import inspect
import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step, maybe_quantize_kv_cache
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import compute_bits_per_weight, load_model

from scoring.engines import Stepwise, package
from scoring.engines.transformers import one_line, tokenizer_strings
from scoring.trace import ScoreError

# mlx-lm's generation's own defaults: the piece of a prompt fed in one forward, and the KV cache
# quantization (none; when kv_bits is set, groups of 64 from the 5,000th token)
DEFAULTS = {k: p.default for k, p in inspect.signature(generate_step).parameters.items()}
PREFILL_STEP = DEFAULTS["prefill_step_size"]
KV_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize takes
DEVICES = {"cpu": mx.cpu, "gpu": mx.gpu}
# The distributions MLX comes in: its Python package, its backends (CPU and CUDA on Linux, Metal
# on macOS), mlx-lm.
PACKAGES = ("mlx", "mlx-cpu", "mlx-metal", "mlx-cuda-12", "mlx-cuda-13", "mlx-lm", "transformers",
            "numpy")  # fmt: skip
# Hybrid architectures whose layers mlx-lm lays out by full_attention_interval (every n-th layer
# attention, the others gated-delta-rule), where transformers writes layer_types.
INTERVAL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def mlx_lm_config(config):
    """What mlx-lm must read beside a config.json as transformers 5 writes it (the changes only):
    `qwen3_5_text` is mlx-lm's `qwen3_5` (whose arguments take a text config as it is);
    `rope_parameters` gives the `rope_theta`, `partial_rotary_factor` and `rope_scaling` mlx-lm's
    qwen3_next wants at the top level, as Qwen's published configs have them. A config whose
    `layer_types` are not the layout mlx-lm builds from `full_attention_interval` is refused:
    mlx-lm would build another model from the same weights' names."""
    if not isinstance(config, dict):
        raise ValueError(f"its config.json holds a {type(config).__name__}, not an object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    over = {}
    if config.get("model_type") == "qwen3_5_text":
        over["model_type"] = "qwen3_5"
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and text is config:
        for key in ("rope_theta", "partial_rotary_factor"):
            if key not in config and key in rope:
                over[key] = rope[key]
        if config.get("rope_scaling") is None:
            over["rope_scaling"] = rope
    types = text.get("layer_types")
    if over.get("model_type", config.get("model_type")) in INTERVAL_TYPES and types:
        every = text.get("full_attention_interval", 4)
        built = ["linear_attention" if (i + 1) % every else "full_attention"
                 for i in range(len(types))]  # fmt: skip
        if list(types) != built:
            raise ValueError(f"its layer_types {types} are not the layout mlx-lm builds from "
                             f"full_attention_interval {every}: layer i full attention where i + "
                             "1 is a multiple of it")  # fmt: skip
    return over


class MLX(Stepwise):
    """The MLX model directory `model` on `device` (cpu or gpu; default MLX's default device).
    Settings, mlx-lm's generation's own: `prefill_step_size` (default 2048), the tokens of a
    prompt fed in one forward before its last; `kv_bits` (default none), `kv_group_size` (64) and
    `quantized_kv_start` (5000): the KV cache quantized as mlx-lm's generation quantizes it, once
    it holds that many tokens."""

    FLAGS = ("device",)

    def __init__(self, model, device=None, prefill_step_size=PREFILL_STEP, kv_bits=None,
                 kv_group_size=DEFAULTS["kv_group_size"],
                 quantized_kv_start=DEFAULTS["quantized_kv_start"]):  # fmt: skip
        path = Path(model)
        if not (path / "config.json").is_file():
            raise ScoreError(
                f"--model {model}: not a model directory (no config.json in it); MLX loads a "
                "directory, as mlx_lm.convert writes one or a Hugging Face model's (`hf download "
                "ID --local-dir DIR`)"
            )
        ints = dict(prefill_step_size=prefill_step_size, kv_group_size=kv_group_size,
                    quantized_kv_start=quantized_kv_start)  # fmt: skip
        for name, v in ints.items():
            low = 0 if name == "quantized_kv_start" else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ScoreError(f"--set {name}={v}: must be an integer of at least {low}")
        if kv_bits is not None and (isinstance(kv_bits, bool) or kv_bits not in KV_BITS):
            raise ScoreError(f"--set kv_bits={kv_bits}: MLX quantizes to "
                             f"{', '.join(map(str, KV_BITS))} bits")  # fmt: skip
        self.kv = dict(bits=kv_bits, group_size=kv_group_size, start=quantized_kv_start)
        if device is None:
            self.device = mx.default_device()
        elif device in DEVICES:
            self.device = mx.Device(DEVICES[device])
        else:
            raise ScoreError(f"--device {device}: MLX's devices are {' and '.join(DEVICES)}")
        if not mx.is_available(self.device):
            raise ScoreError(f"--device {device}: not available to MLX {mx.__version__} here "
                             f"(backends installed: {backends()})")  # fmt: skip
        try:
            config = json.loads((path / "config.json").read_text())
            over = mlx_lm_config(config)
            self.model, self.config = load_model(path, model_config=over)
        except (OSError, ValueError, KeyError, TypeError) as e:  # a JSONDecodeError is a ValueError
            raise ScoreError(f"--model {model}: mlx-lm {mlx_lm.__version__} cannot load it "
                             f"({one_line(e)})") from None  # fmt: skip
        self.path, self.mapped, self.step_size = path, sorted(over), prefill_step_size
        text = self.config.get("text_config") or self.config
        self.n_vocab = int(text["vocab_size"])
        self.n_ctx = text.get("max_position_embeddings")
        with mx.stream(self.device):  # what the model computes in: its output's dtype
            out = self.model(mx.array([[0]]), cache=make_prompt_cache(self.model))
        self.computes = str(out.dtype).removeprefix("mlx.core.")
        self.cache = None

    def vocab_size(self):
        return self.n_vocab

    def vocabulary(self):
        return tokenizer_strings(self.path)

    def context(self):
        return int(self.n_ctx) if self.n_ctx else None

    def describe(self):
        q = self.config.get("quantization")
        weights = {
            str(v.dtype).removeprefix("mlx.core.")
            for _, v in tree_flatten(self.model.parameters())
            if mx.issubdtype(v.dtype, mx.floating)
        }
        return dict(
            engine="mlx", mlx=mx.__version__, mlx_lm=mlx_lm.__version__,
            device=self.device.type.name, model=self.path.name,
            model_type=self.config.get("model_type"), config_mapped=self.mapped,
            dtype=self.computes, weights_dtypes=sorted(weights),
            # as the model's config says (mlx_lm.convert writes it; a layer of its own settings is
            # a key of it); None: not quantized
            quantization=None if q is None else dict(q, mode=q.get("mode", "affine")),
            bits_per_weight=round(float(compute_bits_per_weight(self.model)), 4),
            prefill_step_size=self.step_size, n_vocab=self.n_vocab,
            # mlx-lm's KV cache quantization (bits None: none)
            kv_cache=self.kv,
            packages={p: package(p) for p in PACKAGES},
        )  # fmt: skip

    def forward(self, ids):
        """The logits row of the last of `ids`, fed on the cache, as numpy: a view of MLX's own
        array, which it keeps alive (a copy, np.array, cost 1.7 ms a position here:
        docs/performance.md "Recording through MLX"); MLX never writes an array it has given."""
        with mx.stream(self.device):
            logits = self.model(mx.array(ids, dtype=mx.int32)[None], cache=self.cache)[0, -1]
            if logits.dtype != mx.float32:
                logits = logits.astype(mx.float32)  # bf16 and f16 widen exactly
            self.store()
            mx.eval(logits)
        return np.asarray(logits)

    def store(self):
        """The KV cache quantized where mlx-lm's generation quantizes it: after each forward."""
        try:
            maybe_quantize_kv_cache(self.cache, self.kv["start"], self.kv["group_size"],
                                    self.kv["bits"])  # fmt: skip
        except ValueError as e:
            raise ScoreError(f"--set kv_bits={self.kv['bits']}: MLX cannot quantize "
                             f"{self.path.name}'s KV cache in groups of {self.kv['group_size']} "
                             f"({one_line(e)})") from None  # fmt: skip

    def prefill(self, ids):
        """A prompt on a fresh cache as mlx-lm's generate_step feeds one: the tokens before the
        last in pieces of prefill_step_size, the cache evaluated after each, then the last."""
        self.cache = make_prompt_cache(self.model)
        head = list(ids[:-1])
        with mx.stream(self.device):
            for at in range(0, len(head), self.step_size):
                self.model(mx.array(head[at : at + self.step_size], dtype=mx.int32)[None],
                           cache=self.cache)  # fmt: skip
                self.store()
                mx.eval([c.state for c in self.cache])
        return self.forward(list(ids[-1:]))

    def step(self, token):
        return self.forward([token])


def backends():
    return ", ".join(p for p in PACKAGES[1:5] if package(p)) or "none"
