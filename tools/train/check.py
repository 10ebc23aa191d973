"""Checks a trained GGUF against the PyTorch definition: reads the file back into model.py's
MuseGlimmer and compares its logits with a logits file written by `offgraph logits -o` for the
same tokens (tools/peer/logits_file.h). Prints the largest difference; exits 1 past --tol.

    offgraph logits -m M.gguf -p "In the beginning" --greedy 16 -o /tmp/l.bin
    /usr/bin/python3 tools/train/check.py M.gguf /tmp/l.bin
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, MuseGlimmer  # noqa: E402


def read_gguf(path):
    buf = open(path, "rb").read()
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, buf, at)
        at += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal at
        n = take("Q")
        s = buf[at : at + n].decode("utf-8")
        at += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert buf[:4] == b"GGUF"
    at = 4
    version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    assert version == 3
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        infos.append((name, dims, take("I"), take("Q")))
    align = kv.get("general.alignment", 32)
    base = at + (-at % align)
    tensors = {}
    for name, dims, t, off in infos:
        dtype = {0: np.float32, 1: np.float16}[t]
        n = int(np.prod(dims))
        a = np.frombuffer(buf, dtype=dtype, count=n, offset=base + off)
        tensors[name] = a.reshape(list(reversed(dims))).astype(np.float32)
    return kv, tensors


def load_model(path):
    kv, t = read_gguf(path)
    A = "muse-glimmer."
    E, H = kv[A + "embedding_length"], kv[A + "attention.head_count"]
    cfg = Config(
        n_vocab=t["token_embd.weight"].shape[0], n_embd=E, n_layer=kv[A + "block_count"], n_head=H,
        n_head_kv=kv[A + "attention.head_count_kv"], head_dim=kv[A + "attention.key_length"],
        n_ff=kv[A + "feed_forward_length"], window=kv[A + "attention.sliding_window"],
        rope_base=kv[A + "rope.freq_base"], softcap=kv[A + "final_logit_softcapping"],
        n_ctx=max(kv[A + "context_length"], 4096),
    )
    pattern = kv[A + "attention.sliding_window_pattern"]
    assert [cfg.sliding(i) for i in range(cfg.n_layer)] == list(pattern)
    assert abs(kv[A + "logit_scale"] - cfg.logit_scale) < 1e-6
    m = MuseGlimmer(cfg)
    sd = {"token_embd.weight": t["token_embd.weight"], "output_norm": t["output_norm.weight"],
          "output.weight": t["output.weight"]}
    for i in range(cfg.n_layer):
        p, b = f"blocks.{i}.", f"blk.{i}."
        for n in ["attn_q", "attn_k", "attn_v", "attn_gate", "attn_output", "ffn_gate", "ffn_up",
                  "ffn_down"]:
            sd[p + n + ".weight"] = t[b + n + ".weight"]
        for n in ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"]:
            sd[p + n] = t[b + n + ".weight"]
        assert np.allclose(t[b + "attn_q_norm.weight"], cfg.q_gain)
        assert np.allclose(t[b + "attn_k_norm.weight"], 1.0)
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    m.eval()
    return m, kv


def read_logits(path):
    buf = open(path, "rb").read()
    magic, ver, n_vocab, n_rows, n_tokens, n_prompt = struct.unpack_from("<6I", buf, 0)
    assert magic == 0x544C474F and ver == 1
    toks = np.frombuffer(buf, dtype="<u4", count=n_tokens, offset=24).astype(np.int64)
    logits = np.frombuffer(buf, dtype="<f4", count=n_rows * n_vocab, offset=24 + 4 * n_tokens)
    return toks, logits.reshape(n_rows, n_vocab)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=0.05)
    args = ap.parse_args()
    m, _ = load_model(args.model)
    toks, theirs = read_logits(args.logits)
    with torch.no_grad():
        ours = m(torch.from_numpy(toks[: len(theirs)])[None])[0].double().numpy()
    diff = np.abs(ours - theirs).max()
    agree = (ours.argmax(-1) == theirs.argmax(-1)).mean()
    print(f"{len(theirs)} rows: max |logit difference| {diff:.2e}, argmax agreement {agree:.3f}")
    sys.exit(0 if diff <= args.tol else 1)


if __name__ == "__main__":
    main()
