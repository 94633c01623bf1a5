"""A tiny model of Qwen3.8's architecture for trying score.py offline, and for its tests.

    python tests/make_model.py DIR

writes to DIR a transformers model of the `qwen3_5_text` architecture (gated-delta-rule layers
with recurrent and convolution state, and an attention layer with a KV cache) with random weights
from a fixed seed, and a tokenizer for it: the byte-level test tokenizer of tests/make_sources.py
with the chat tokens of a Qwen-style chat template (written here, with tools and thinking). No
download: everything is built from a config. The output layer is scaled so that the distributions
are not flat (random weights alone give nearly uniform ones, where nothing can flip)."""

import math
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import GenerationConfig, PreTrainedTokenizerFast
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

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


def tokenizer():
    tok = _byte_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )


def make_model(out):
    out = Path(out)
    tok = tokenizer()
    eos = tok.convert_tokens_to_ids(EOS)
    config = Qwen3_5TextConfig(vocab_size=len(tok), eos_token_id=eos, **CONFIG)
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(config).eval()
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


if __name__ == "__main__":
    print(f"wrote {make_model(sys.argv[1])}")
