"""Trains the small Muse Glimmer model on the King James Bible and writes it as a GGUF.

    /usr/bin/python3 tools/train/train.py --out models/muse-glimmer-kjv.gguf

Everything is seeded: the held-out split is fixed, the chat conversations, the BPE vocabulary, the
initial weights and the batches come from --seed. Run through tools/train/train.sh, which installs
what this needs from Debian first.
"""

import argparse
import collections
import json
import math
import os
import sys
import time

import numpy as np
import regex
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import data  # noqa: E402
import gguf_write  # noqa: E402
from model import Config, MuseGlimmer  # noqa: E402


def log(*a):
    print(f"[train {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def build_vocab(texts, n_vocab):
    sp = regex.compile("|".join(regex.escape(s) for s in data.SPECIALS))
    counts = collections.Counter()
    for t in texts:
        for frag in sp.split(t):
            counts.update(bpe.words(frag))
    merges = bpe.train(counts, n_vocab - 256 - len(data.SPECIALS))
    tokens = bpe.BYTE_CHARS + [a + b for a, b in merges] + data.SPECIALS
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    return tokens, merges


def perplexity(model, ids, n_ctx, bos):
    """llama.cpp's scheme: consecutive windows of n_ctx tokens, the first replaced by BOS, the
    second half of each window scored."""
    model.eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - n_ctx + 1, n_ctx):
            w = torch.tensor(ids[start : start + n_ctx], dtype=torch.long)[None]
            w[0, 0] = bos
            logp = F.log_softmax(model(w).float(), -1)
            first = n_ctx // 2
            tgt = w[0, first + 1 :]
            nll -= logp[0, first : n_ctx - 1].gather(-1, tgt[:, None]).sum().item()
            count += len(tgt)
    model.train()
    return math.exp(nll / count), count


def export(model, cfg, tokens, merges, template, path, name):
    w = gguf_write.Writer()
    A = "muse-glimmer."
    w.add("general.architecture", gguf_write.STR, "muse-glimmer")
    w.add("general.name", gguf_write.STR, name)
    w.add("general.license", gguf_write.STR, "public-domain")
    w.add("general.description", gguf_write.STR,
          "A small Muse Glimmer model trained by offgraph's tools/train on the King James Bible "
          "(public domain, Debian's bible-kjv-text).")
    w.add("general.file_type", gguf_write.U32, 1)  # mostly F16
    for key, v in [
        ("context_length", cfg.n_ctx),
        ("embedding_length", cfg.n_embd),
        ("feed_forward_length", cfg.n_ff),
        ("block_count", cfg.n_layer),
        ("attention.head_count", cfg.n_head),
        ("attention.head_count_kv", cfg.n_head_kv),
        ("attention.key_length", cfg.head_dim),
        ("attention.value_length", cfg.head_dim),
        ("attention.sliding_window", cfg.window),
        ("vocab_size", cfg.n_vocab),
    ]:
        w.add(A + key, gguf_write.U32, v)
    w.add(A + "attention.layer_norm_rms_epsilon", gguf_write.F32, cfg.rms_eps)
    w.add(A + "rope.freq_base", gguf_write.F32, cfg.rope_base)
    w.add_array(A + "attention.sliding_window_pattern", gguf_write.BOOL,
                [cfg.sliding(i) for i in range(cfg.n_layer)])
    w.add(A + "final_logit_softcapping", gguf_write.F32, cfg.softcap)
    w.add(A + "logit_scale", gguf_write.F32, cfg.logit_scale)

    bos, eos = tokens.index(data.BOS), tokens.index(data.EOS)
    eot, pad = tokens.index("<|eot|>"), tokens.index("<|finetune_right_pad|>")
    w.add("tokenizer.ggml.model", gguf_write.STR, "gpt2")
    w.add("tokenizer.ggml.pre", gguf_write.STR, "llama4")
    w.add_array("tokenizer.ggml.tokens", gguf_write.STR, tokens)
    types = [3 if t in data.SPECIALS else 1 for t in tokens]  # CONTROL, NORMAL
    w.add_array("tokenizer.ggml.token_type", gguf_write.I32, types)
    w.add_array("tokenizer.ggml.merges", gguf_write.STR, [f"{a} {b}" for a, b in merges])
    w.add("tokenizer.ggml.bos_token_id", gguf_write.U32, bos)
    w.add("tokenizer.ggml.eos_token_id", gguf_write.U32, eos)
    w.add("tokenizer.ggml.eot_token_id", gguf_write.U32, eot)
    w.add("tokenizer.ggml.padding_token_id", gguf_write.U32, pad)
    w.add("tokenizer.ggml.add_bos_token", gguf_write.BOOL, True)
    w.add("tokenizer.ggml.add_sep_token", gguf_write.BOOL, False)
    w.add("tokenizer.ggml.add_eos_token", gguf_write.BOOL, False)
    w.add("tokenizer.chat_template", gguf_write.STR, template)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    F16, F32 = gguf_write.GGML_F16, gguf_write.GGML_F32
    w.add_tensor("token_embd.weight", sd["token_embd.weight"], F16)
    w.add_tensor("output_norm.weight", sd["output_norm"], F32)
    w.add_tensor("output.weight", sd["output.weight"], F16)
    for i in range(cfg.n_layer):
        p, b = f"blocks.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "attn_norm"], F32)
        for n in ["attn_q", "attn_k", "attn_v", "attn_gate"]:
            w.add_tensor(b + n + ".weight", sd[p + n + ".weight"], F16)
        w.add_tensor(b + "attn_q_norm.weight", np.full(cfg.head_dim, cfg.q_gain), F32)
        w.add_tensor(b + "attn_k_norm.weight", np.ones(cfg.head_dim), F32)
        w.add_tensor(b + "attn_output.weight", sd[p + "attn_output.weight"], F16)
        w.add_tensor(b + "post_attention_norm.weight", sd[p + "post_attention_norm"], F32)
        w.add_tensor(b + "ffn_norm.weight", sd[p + "ffn_norm"], F32)
        for n in ["ffn_gate", "ffn_up", "ffn_down"]:
            w.add_tensor(b + n + ".weight", sd[p + n + ".weight"], F16)
        w.add_tensor(b + "post_ffw_norm.weight", sd[p + "post_ffw_norm"], F32)
    w.write(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", help="write the held-out chapters here (plain text)")
    ap.add_argument("--template", required=True, help="the Muse Glimmer chat template to embed")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--ff", type=int, default=768)
    ap.add_argument("--ctx", type=int, default=512, help="training sequence length")
    ap.add_argument("--ctx-key", type=int, default=0, help="context_length written (default --ctx)")
    ap.add_argument("--chats", type=int, default=6000, help="chat conversations in the data")
    ap.add_argument("--bf16", type=int, default=1, help="bf16 autocast for the matrix products")
    ap.add_argument("--name", default="offgraph Muse Glimmer KJV")
    ap.add_argument("--report", help="write figures as JSON here")
    args = ap.parse_args()

    t0 = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    chapters = data.read_kjv()
    train_ch, held_ch = data.split(chapters)
    texts = [data.BOS + data.chapter_text(*c) + data.EOS for c in train_ch]
    chats = data.chat_examples(train_ch, args.chats, args.seed)
    held_text = "\n".join(data.chapter_text(*c) for c in held_ch)
    if args.heldout:
        with open(args.heldout, "w") as f:
            f.write(held_text)
    log(f"{len(train_ch)} training chapters, {len(held_ch)} held out, {len(chats)} chats")

    tokens, merges = build_vocab(texts + chats, args.vocab)
    enc = bpe.Encoder(tokens, merges, data.SPECIALS)
    docs = [enc.encode(t) for t in texts + chats]
    order = rng.permutation(len(docs))
    stream = np.concatenate([np.asarray(docs[i], dtype=np.int64) for i in order])
    bos = tokens.index(data.BOS)
    held_ids = [bos] + enc.encode(held_text, parse_special=False)
    log(f"vocabulary {len(tokens)} ({len(merges)} merges), {len(stream)} training tokens "
        f"({sum(len(d) for d in docs[: len(texts)])} text, {sum(len(d) for d in docs[len(texts):])} "
        f"chat), {len(held_ids)} held-out tokens; {time.time() - t0:.0f} s")

    cfg = Config(n_vocab=args.vocab, n_embd=args.embd, n_layer=args.layers, n_head=args.heads,
                 n_head_kv=args.heads_kv, head_dim=args.embd // args.heads, n_ff=args.ff,
                 n_ctx=args.ctx)
    model = MuseGlimmer(cfg)
    model.reset(torch.Generator().manual_seed(args.seed))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {cfg}, {n_params} parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = max(1, args.steps // 20)

    def lr_at(s):
        if s < warmup:
            return args.lr * (s + 1) / warmup
        q = (s - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * q)))

    T, B = args.ctx, args.batch
    t_train = time.time()
    smooth = None
    for step in range(args.steps):
        starts = rng.integers(0, len(stream) - T - 1, size=B)
        batch = torch.from_numpy(np.stack([stream[s : s + T + 1] for s in starts]))
        batch[:, 0] = bos  # every window starts as the perplexity tool starts one
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.bf16)):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.n_vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            log(f"step {step}/{args.steps} loss {smooth:.3f} lr {lr_at(step):.2e} "
                f"{(step + 1) * B * T / el:.0f} tok/s, {el:.0f} s")
    train_s = time.time() - t_train

    ppl, n_scored = perplexity(model, held_ids, T, bos)
    log(f"held-out perplexity (torch, ctx {T}): {ppl:.3f} over {n_scored} tokens")
    cfg.n_ctx = args.ctx_key or args.ctx
    export(model, cfg, tokens, merges, open(args.template).read(), args.out, args.name)
    size = os.path.getsize(args.out)
    log(f"wrote {args.out}: {size} bytes; training {train_s:.0f} s, all {time.time() - t0:.0f} s")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"params": n_params, "train_seconds": round(train_s),
                       "total_seconds": round(time.time() - t0), "bytes": size,
                       "train_tokens": int(len(stream)), "seen_tokens": args.steps * B * T,
                       "heldout_tokens": len(held_ids), "torch_ppl": round(ppl, 4),
                       "torch_ppl_ctx": T, "config": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
