#!/usr/bin/python3
"""Writes a deterministic RGB PNG for the image-prompt peer test: a gradient with noise.

    make_image.py OUT WIDTH HEIGHT SEED

The pixels depend only on WIDTH, HEIGHT and SEED (Python's Mersenne Twister getrandbits, stable
across versions); Pillow (python3-pil) writes the PNG, lossless.
"""
import random
import sys

from PIL import Image


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    out, w, h, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if w < 1 or h < 1:
        print("make_image.py: WIDTH and HEIGHT must be positive", file=sys.stderr)
        return 2
    rng = random.Random(seed)
    pixels = []
    for y in range(h):
        for x in range(w):
            noise = rng.getrandbits(6) - 32  # -32..31
            r = (x * 255 // max(w - 1, 1) + noise) % 256
            g = (y * 255 // max(h - 1, 1) - noise) % 256
            b = ((x * 7 + y * 13) % 256 + rng.getrandbits(5)) % 256
            pixels.append((r, g, b))
    im = Image.new("RGB", (w, h))
    im.putdata(pixels)
    im.save(out, format="PNG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
