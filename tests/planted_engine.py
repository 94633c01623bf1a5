"""A plug-in engine with a planted bug (docs/scoring.md "What the judge catches"):
`--engine planted_engine:Planted --set bug=BUG --set size=X --set from_step=N` with tests/ on the
Python path.

It runs a transformers model in float32 through a cache of its own (prefill in one forward, then
one token a forward, every position given explicitly), and with `bug=none` it is a correct
engine. Any other bug is switched on from decode step `from_step` (1-based: decode step N is
the row made by the N-th token fed after the prefill) to the end, so the rows before it are the
correct engine's, bit for bit; the judge should find it at that step.

| bug | what goes wrong from decode step N | size (default) |
|---|---|---|
| noise | every logit plus a normal draw of standard deviation `size` (seeded by `seed` and the position) | 1e-2 |
| scale | every logit times 1 + `size` | 1e-2 |
| rotary | each token fed is rotated as if `size` positions further on (its keys stay so in the cache) | 1 |
| mask | every attention layer lowers the first token's attention score by `size` | inf: masked out |
| unfed | `size` tokens in a row are not fed: each of their steps gives the row before again | 1 |
| reset | the cache is emptied before the token of step N is fed | - |
"""

import math

import numpy as np

from scoring.engines import Stepwise
from scoring.trace import ScoreError

DEFAULT_SIZE = {"none": None, "noise": 1e-2, "scale": 1e-2, "rotary": 1.0, "mask": math.inf,
                "unfed": 1, "reset": None}  # fmt: skip
BUGS = tuple(DEFAULT_SIZE)
ATTENTION = "planted"  # the attention function registered below: sdpa, with the mask bug in it


def planted_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention; where the layer carries `planted_lower` (a number), the
    first key's score is lowered by it (decode: one query, every key visible)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lower = getattr(module, "planted_lower", None)
    if lower is not None:
        bias = torch.zeros(1, 1, query.shape[2], key.shape[2], dtype=query.dtype)
        bias[..., 0] = -lower
        if attention_mask is None:
            attention_mask = bias
        elif attention_mask.dtype == torch.bool:
            attention_mask = torch.where(attention_mask, bias, -math.inf)
        else:
            attention_mask = attention_mask + bias
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, planted_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


class Planted(Stepwise):
    def __init__(self, model, bug="none", size=None, from_step=1, seed=0):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        if bug not in BUGS:
            raise ScoreError(f"--set bug={bug}: not a planted bug ({', '.join(BUGS)})")
        if not (isinstance(from_step, int) and from_step >= 1):
            raise ScoreError(f"--set from_step={from_step}: a decode step, 1 or more")
        size = DEFAULT_SIZE[bug] if size is None else size
        if bug == "unfed" and not (isinstance(size, int) and size >= 1):
            raise ScoreError(f"--set size={size}: unfed takes a number of tokens, 1 or more")
        if size is not None and bug != "unfed":
            size = float(size)  # "inf" comes as text
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        register()
        self.torch, self.bug, self.size, self.from_step, self.seed = (
            torch,
            bug,
            size,
            from_step,
            seed,
        )
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch.float32, attn_implementation=ATTENTION
        ).eval()
        self.attention = [m for m in self.model.modules() if hasattr(m, "num_key_value_groups")]
        self.shift = 0.0  # the rotary bug's offset in the forward under way
        self.model.model.rotary_emb.register_forward_pre_hook(self.shifted, with_kwargs=True)

    def describe(self):
        size = self.size if self.size is None or math.isfinite(self.size) else str(self.size)
        return dict(engine="planted", bug=self.bug, size=size, from_step=self.from_step,
                    seed=self.seed, dtype="float32")  # fmt: skip

    def vocab_size(self):
        return int(self.model.get_input_embeddings().num_embeddings)

    def shifted(self, module, args, kwargs):
        """The rotary embedding's positions moved by `shift`: its arguments are (states,
        positions), positions given by name in some models (transformers' Llama)."""
        if not self.shift:
            return None
        if "position_ids" in kwargs:
            return args, kwargs | {"position_ids": kwargs["position_ids"] + self.shift}
        return (args[0], args[1] + self.shift, *args[2:]), kwargs

    def forward(self, ids):
        torch = self.torch
        pos = torch.arange(self.pos, self.pos + len(ids))[None]
        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(ids, np.int64)[None])
            out = self.model(input_ids=x, position_ids=pos, cache=self.cache, use_cache=True,
                             logits_to_keep=1)  # fmt: skip
        self.pos += len(ids)
        return out.logits[0, -1].numpy()

    def new_cache(self):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    def prefill(self, ids):
        self.new_cache()
        self.pos, self.steps = 0, 0
        self.row = self.forward(ids)
        return self.row

    def step(self, token):
        self.steps += 1
        bug = self.bug if self.steps >= self.from_step else "none"
        if bug == "unfed" and self.steps < self.from_step + self.size:
            self.pos += 1  # the token keeps its place; the cache never sees it
            return self.row
        if bug == "reset" and self.steps == self.from_step:
            self.new_cache()
        self.shift = self.size if bug == "rotary" else 0.0
        for m in self.attention:
            m.planted_lower = self.size if bug == "mask" else None
        try:
            row = self.forward([token])
        finally:
            self.shift = 0.0
            for m in self.attention:
                m.planted_lower = None
        if bug == "noise":
            rng = np.random.default_rng([self.seed, self.pos])
            row = row + rng.normal(0.0, self.size, row.shape)  # float64
        elif bug == "scale":
            row = row.astype(np.float64) * (1.0 + self.size)
        self.row = row
        return row
