"""GGUF files of the tiny model for the llama.cpp engine's tests (docs/scoring.md "llama.cpp").

    python tests/make_gguf.py OUT --tokenizer QWEN_TOKENIZER_JSON [--sdist SDIST] [--types f32,q8_0]
                              [--arch qwen3_5_gguf]

writes OUT/hf (tests/make_model.py's "qwen3_5_gguf": the Qwen tokenizer, the geometry llama.cpp
runs) and OUT/tiny-<type>.gguf for each type, made by llama.cpp's own converter
(`vendor/llama.cpp/convert_hf_to_gguf.py`, with its `conversion/` and `gguf-py/` beside it), run
from llama-cpp-python's source package: SDIST is that .tar.gz (default
.venv/llama-sdist/llama_cpp_python-0.3.36.tar.gz, where the README's test command downloads it),
unpacked into a temporary folder. The converter is never copied into this repository. It needs
torch, transformers, safetensors and pyyaml. A type the converter does not write (q4_0, q4_k_m)
is quantized from the f32 file by llama.cpp's own quantize function (llama-cpp-python's
`llama_model_quantize`). `--arch` is another of tests/make_model.py's architectures (qwen3: its
dense Qwen3, docs/scoring.md "MLX").
"""

import argparse
import ctypes
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SDIST = TESTS.parent / ".venv" / "llama-sdist" / "llama_cpp_python-0.3.36.tar.gz"
sys.path.insert(0, str(TESTS))


def converter(sdist, tmp):
    """The unpacked folder holding convert_hf_to_gguf.py."""
    with tarfile.open(sdist) as tf:
        wanted = [m for m in tf.getmembers() if "/vendor/llama.cpp/" in m.name and (
            m.name.endswith("/convert_hf_to_gguf.py") or "/conversion/" in m.name
            or "/gguf-py/" in m.name)]  # fmt: skip
        tf.extractall(tmp, members=wanted, filter="data")
    found = sorted(Path(tmp).glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise SystemExit(f"{sdist}: no vendor/llama.cpp/convert_hf_to_gguf.py in it")
    return found[0]


QUANTIZED = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def quantize(src, dst, ftype):
    """llama.cpp's quantization of the GGUF file src into dst (ftype: a LLAMA_FTYPE_ name)."""
    import llama_cpp as L

    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, ftype)
    if L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)):
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} ({ftype}) failed")


def make_gguf(out, tokenizer, sdist=SDIST, types=("f32", "q8_0"), arch="qwen3_5_gguf",
              progress=False):  # fmt: skip
    """OUT/hf and {type: OUT/tiny-<type>.gguf}; with `progress`, a line on stderr as each step
    starts (the converter runs for about 15 s a type)."""
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: 0)
    say(f"making the model in {Path(out) / 'hf'}")
    from make_model import make_model

    out = Path(out)
    hf = make_model(out / "hf", arch, tokenizer)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = converter(sdist, tmp)
        for t in [t for t in types if t not in QUANTIZED]:
            files[t] = out / f"tiny-{t}.gguf"
            say(f"converting it to {files[t]} with llama.cpp's convert_hf_to_gguf.py")
            cmd = [sys.executable, str(script), str(hf), "--outfile", str(files[t]),
                   "--outtype", t] + (["--no-mtp"] if arch.startswith("qwen3_5") else [])  # fmt: skip
            got = subprocess.run(cmd, capture_output=True, text=True)
            if got.returncode:
                raise RuntimeError(f"convert_hf_to_gguf.py --outtype {t} failed:\n"
                                   f"{got.stdout[-2000:]}{got.stderr[-3000:]}")  # fmt: skip
    for t in [t for t in types if t in QUANTIZED]:
        files[t] = out / f"tiny-{t}.gguf"
        say(f"quantizing {files['f32']} to {files[t]} with llama.cpp's quantize")
        quantize(files["f32"], files[t], QUANTIZED[t])
    return hf, files


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="where to write OUT/hf and OUT/tiny-<type>.gguf")
    p.add_argument("--tokenizer", required=True, type=Path,
                   help="a tokenizer.json of Qwen3.5's vocabulary (248,320 tokens), whose "
                   "pre-tokenizer llama.cpp's converter knows; the tests read "
                   "../shared/tokenizers/qwen3.5-text.json")  # fmt: skip
    p.add_argument("--sdist", default=SDIST, type=Path,
                   help="llama-cpp-python's source package (default: the one "
                   "tests/setup_engines.sh downloads)")  # fmt: skip
    p.add_argument("--types", default="f32,q8_0",
                   help="GGUF types to write (default: f32,q8_0; q4_0 and q4_k_m are quantized "
                   "from f32, which must then be among them)")  # fmt: skip
    p.add_argument("--arch", default="qwen3_5_gguf",
                   help="tests/make_model.py's architecture (default: qwen3_5_gguf; qwen3: its "
                   "dense Qwen3)")  # fmt: skip
    return p


def main(argv=None):
    a = parser().parse_args(argv)
    if not a.tokenizer.is_file():
        sys.exit(f"error: --tokenizer {a.tokenizer}: no such file; this script needs a tokenizer.json "
                 "of Qwen3.5's vocabulary (llama.cpp's converter refuses a tokenizer it does not "
                 "know)")  # fmt: skip
    if not Path(a.sdist).is_file():
        sys.exit(f"error: {a.sdist} not found: bash tests/setup_engines.sh downloads it (or give "
                 "--sdist, llama-cpp-python's source package)")  # fmt: skip
    try:
        _, files = make_gguf(a.out, a.tokenizer, a.sdist, a.types.split(","), a.arch, progress=True)
    except RuntimeError as e:
        sys.exit(f"error: {e}")
    for f in files.values():
        print(f"wrote {f}")


if __name__ == "__main__":
    main()
