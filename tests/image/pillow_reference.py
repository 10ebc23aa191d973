#!/usr/bin/env python3
"""The direct computation image/preprocess.h is checked against (tests/image/preprocess_test.cpp):
the grid mtmd chooses for Muse Glimmer (transformers' aspect-ratio-preserving size, written out
here from its definition), Pillow's own Image.resize(LANCZOS) and numpy's normalisation.

    pillow_reference.py IN.rgb W H CELL MAX_TOKENS MEAN_R MEAN_G MEAN_B STD_R STD_G STD_B OUT

IN.rgb: W*H*3 bytes. Writes OUT.size ("width height"), OUT.rgb (the resized pixels) and OUT.f32
(planar normalised float32, R then G then B)."""
import math
import sys

import numpy as np
from PIL import Image


def grid(w, h, cell, max_tokens):
    rows, cols = h / cell, w / cell
    ratio = cols / rows if rows > 0 else 1.0
    if rows * cols > max_tokens:
        rows = math.sqrt(max_tokens / ratio)
        cols = rows * ratio
    target = h / w
    best = None
    for r in (math.floor(rows), math.ceil(rows)):
        for c in (math.floor(cols), math.ceil(cols)):
            if r < 1 or c < 1 or r * c > max_tokens:
                continue
            d = abs(r / c - target)
            if best is None or d < best[0] or (d == best[0] and r * c > best[1] * best[2]):
                best = (d, r, c)
    if best is None:  # offgraph then keeps the cap (src/image/preprocess.h); the reference may not
        r, c = max(1, math.floor(rows + 0.5)), max(1, math.floor(cols + 0.5))  # C llround
        if r * c > max_tokens:
            if r >= c:
                r = max(1, max_tokens // c)
            else:
                c = max(1, max_tokens // r)
        best = (0, r, c)
    return best[2] * cell, best[1] * cell


def main():
    a = sys.argv[1:]
    src, w, h, cell, max_tokens = a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4])
    mean = np.array([float(x) for x in a[5:8]], dtype=np.float32)
    std = np.array([float(x) for x in a[8:11]], dtype=np.float32)
    out = a[11]
    with open(src, "rb") as f:
        img = Image.frombytes("RGB", (w, h), f.read())
    tw, th = grid(w, h, cell, max_tokens)
    resized = img.resize((tw, th), Image.LANCZOS)
    pixels = np.asarray(resized, dtype=np.uint8)  # [h, w, 3]
    x = pixels.astype(np.float32) / np.float32(255.0)
    x = (x - mean) / std
    with open(out + ".size", "w") as f:
        f.write("%d %d\n" % (tw, th))
    with open(out + ".rgb", "wb") as f:
        f.write(pixels.tobytes())
    with open(out + ".f32", "wb") as f:
        f.write(np.ascontiguousarray(x.transpose(2, 0, 1)).astype(np.float32).tobytes())


if __name__ == "__main__":
    main()
