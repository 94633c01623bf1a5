"""The rows of a split: a build's OUT or the published dataset, read by the same code and checked
against the manifest beside them; the rows a run takes, rendered with the model's chat template
(docs/scoring.md "Recording")."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq

from scoring import builder as build
from scoring.trace import Schedule, ScoreError


@dataclass(frozen=True, slots=True)
class Row:
    index: int  # in the split file
    source: str
    name: str
    messages: list
    tools: list | None


def hub_rows(spec, split):
    """Download `split` and the manifest of the published dataset (`hub` or `hub:REPO[@REV]`)."""
    repo, _, revision = spec.partition(":")[2].partition("@")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ScoreError("--rows hub needs huggingface_hub (pip install -e '.[score]')") from None
    files = {}
    for name in (f"{split}.parquet", "manifest.json"):
        try:
            files[name] = hf_hub_download(
                repo or build.REPO_ID, name, repo_type="dataset", revision=revision or None
            )
        except Exception as e:  # the hub client's errors have no common base worth naming
            raise ScoreError(f"cannot download {name} of {repo or build.REPO_ID}: {e}") from None
    return Path(files[f"{split}.parquet"]), Path(files["manifest.json"])


def is_hub(rows_arg):
    """`--rows` means the published dataset only as `hub` or `hub:REPO[@REV]`; anything else
    is a local path (a directory `hubdir`, or `./hub`)."""
    return rows_arg == "hub" or rows_arg.startswith("hub:")


def read_rows(rows_arg, split):
    """The split's rows, after checking the split file against the manifest beside it."""
    if is_hub(rows_arg):
        data, manifest_path = hub_rows(rows_arg, split)
    else:
        out = Path(rows_arg)
        if not out.is_dir():
            raise ScoreError(f"--rows {out}: not a build's output directory")
        data, manifest_path = out / f"{split}.parquet", out / "manifest.json"
        if not data.is_file():
            raise ScoreError(
                f"--rows {out}: no {split}.parquet (splits: {', '.join(build.SPLIT_NAMES)})"
            )
        if not manifest_path.is_file():
            raise ScoreError(f"--rows {out}: no manifest.json: not a build's output directory")
    try:
        manifest = orjson.loads(manifest_path.read_bytes())
        want = manifest["splits"][split]["file_sha256"]
        names = {r["index"]: r["name"] for r in manifest["rows"] if r["split"] == split}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise ScoreError(f"{manifest_path}: not a build's manifest ({e})") from None
    got = build.sha256_file(data)
    if got != want:
        raise ScoreError(
            f"{data}: sha256 {got} is not the {want} its manifest lists: the rows are not that build's"
        )
    table = pq.read_table(data)
    rows = []
    for i, (m, t, s) in enumerate(
        zip(table["messages"].to_pylist(), table["tools"].to_pylist(), table["source"].to_pylist())
    ):
        rows.append(Row(i, s, names.get(i, "-"), orjson.loads(m), orjson.loads(t) if t else None))
    return rows


def choose(rows, sources=None, first=None, shard=(0, 1)):
    """The rows a run takes: those of the named sources, then the first N, then every n-th."""
    if sources:
        rows = [r for r in rows if r.name in sources]
    if first is not None:
        rows = rows[:first]
    i, n = shard
    return [r for j, r in enumerate(rows) if j % n == i]


def render(tokenizer, row, options):
    """The row's token ids through the model's own chat template, the generation prompt open."""
    try:
        out = tokenizer.apply_chat_template(
            row.messages, tools=row.tools, add_generation_prompt=True, tokenize=True, **options
        )
    except Exception as e:  # a template raises whatever its author chose
        raise ScoreError(
            f"the chat template cannot render row {row.index} ({row.source}): {e}"
        ) from None
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return np.asarray(ids, dtype=np.int32).reshape(-1)


def load_tokenizer(model, flag="--model"):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError, KeyError) as e:
        raise ScoreError(f"{flag} {model}: no tokenizer transformers can load ({e})") from None


def stop_ids(tokenizer, model_dir):
    """The ids a reference never samples: every end-of-sequence id of the tokenizer, the model's
    config and its generation config."""
    from transformers import AutoConfig, GenerationConfig

    ids = {tokenizer.eos_token_id}
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            eos = getattr(load(model_dir), "eos_token_id", None)
        except (OSError, ValueError):
            continue
        ids |= set(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def tokenizer_sha256(tokenizer):
    return build.sha256_hex(tokenizer.backend_tokenizer.to_str())


def plan_rows(args, tokenizer, context):
    """Render the chosen rows; keep those whose prompt plus continuation fit the context. A shard
    of a run that chose rows may get none, or none that fit: it is a shard all the same, recorded
    empty, so that the run's shards merge (docs/scoring.md "Recording")."""
    rows = read_rows(args.rows, args.split)
    cap = next(s.decode_cap for s in build.SPLITS if s.name == args.split)
    length = args.length or cap
    if length < 1 or length > cap:
        raise ScoreError(f"--length must be from 1 to the {args.split} split's cap, {cap}")
    chosen = choose(rows, args.sources, args.first, args.shard)
    if not chosen and not choose(rows, args.sources, args.first, (0, 1)):
        raise ScoreError("no row is chosen: check --sources and --first")
    options = {"enable_thinking": args.thinking == "on"}
    plan, skipped = [], []
    for row in chosen:
        ids = render(tokenizer, row, options)
        if context and len(ids) + length > context:
            skipped.append(dict(index=row.index, source=row.source, rendered=len(ids)))
            continue
        plan.append((list(map(int, ids)), Schedule(len(ids), length - 1), row))
    if not plan and args.shard[1] == 1:
        raise ScoreError(
            f"no chosen row fits a context of {context} tokens with {length} to decode"
        )
    return plan, skipped, length, options
