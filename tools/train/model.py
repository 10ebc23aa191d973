"""Muse Glimmer in PyTorch, exactly as offgraph and llama.cpp compute it from GGUF (MUSE_GLIMMER.md
section 6): weightless embedding norm; per layer sandwich norms (pre at 1e-5, post at 1e-8), gated
attention with weightless per-head QK-norm times fixed gains (3.87 on q, 1 on k), RoPE in ggml's
NORM mode (adjacent pairs) on the sliding-window layers only, NoPE global layers, SwiGLU; final
norm, untied head, logit scale and a tanh soft-cap. Weights are kept in GGUF's orientation."""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 4096
    n_embd: int = 256
    n_layer: int = 8
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 768
    window: int = 64
    period: int = 4  # layer i slides iff i % period < period - 1 (3 local : 1 global)
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    post_eps: float = 1e-8
    q_gain: float = 3.87
    softcap: float = 20.0
    n_ctx: int = 512

    @property
    def logit_scale(self):
        return 1.0 / math.sqrt(self.n_embd / 256.0)

    def sliding(self, i):
        return i % self.period < self.period - 1


def rms(x, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_tables(cfg, n):
    """cos/sin of ggml's NORM mode: pair i of a head (dims 2i, 2i+1) turns by p * base^(-2i/d)."""
    inv = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    # x: [B, T, H, D]; rotate adjacent pairs.
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        E, QW, KW = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self.cfg, self.sliding = cfg, cfg.sliding(i)
        self.attn_norm = nn.Parameter(torch.ones(E))
        self.attn_q = nn.Linear(E, QW, bias=False)
        self.attn_k = nn.Linear(E, KW, bias=False)
        self.attn_v = nn.Linear(E, KW, bias=False)
        self.attn_gate = nn.Linear(E, QW, bias=False)
        self.attn_output = nn.Linear(QW, E, bias=False)
        self.post_attention_norm = nn.Parameter(torch.ones(E))
        self.ffn_norm = nn.Parameter(torch.ones(E))
        self.ffn_gate = nn.Linear(E, cfg.n_ff, bias=False)
        self.ffn_up = nn.Linear(E, cfg.n_ff, bias=False)
        self.ffn_down = nn.Linear(cfg.n_ff, E, bias=False)
        self.post_ffw_norm = nn.Parameter(torch.ones(E))

    def forward(self, x, cos, sin, mask):
        cfg = self.cfg
        B, T, _ = x.shape
        a = rms(x, cfg.rms_eps) * self.attn_norm
        q = self.attn_q(a).view(B, T, cfg.n_head, cfg.head_dim)
        k = self.attn_k(a).view(B, T, cfg.n_head_kv, cfg.head_dim)
        v = self.attn_v(a).view(B, T, cfg.n_head_kv, cfg.head_dim)
        g = self.attn_gate(a)
        q = rms(q, cfg.rms_eps) * cfg.q_gain
        k = rms(k, cfg.rms_eps)
        if self.sliding:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = cfg.n_head // cfg.n_head_kv
        q = q.transpose(1, 2)  # B H T D
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(cfg.head_dim)) + mask
        o = (s.softmax(-1).to(v.dtype) @ v).transpose(1, 2).reshape(B, T, -1)
        o = o * torch.sigmoid(g)
        x = x + rms(self.attn_output(o), cfg.post_eps) * self.post_attention_norm
        f = rms(x, cfg.rms_eps) * self.ffn_norm
        h = F.silu(self.ffn_gate(f)) * self.ffn_up(f)
        return x + rms(self.ffn_down(h), cfg.post_eps) * self.post_ffw_norm


class MuseGlimmer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.token_embd = nn.Embedding(cfg.n_vocab, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.output_norm = nn.Parameter(torch.ones(cfg.n_embd))
        self.output = nn.Linear(cfg.n_embd, cfg.n_vocab, bias=False)
        cos, sin = rope_tables(cfg, cfg.n_ctx)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.reset(torch.Generator().manual_seed(0))

    def reset(self, gen):
        """Init: normal(0, 1/sqrt(fan_in)) matrices, residual branches' post-norm gains at
        1/sqrt(2 x layers) so the stream starts near the embedding, unit embedding rows."""
        for name, p in self.named_parameters():
            with torch.no_grad():
                if p.dim() == 2 and name.startswith("token_embd"):
                    p.copy_(torch.randn(p.shape, generator=gen))
                elif p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
                elif "post_" in name:
                    p.fill_(1.0 / math.sqrt(2 * self.cfg.n_layer))
                else:
                    p.fill_(1.0)

    def masks(self, T, device=None):
        i = torch.arange(T)
        d = i[:, None] - i[None, :]
        causal = torch.where(d >= 0, 0.0, float("-inf"))
        sliding = torch.where((d >= 0) & (d < self.cfg.window), 0.0, float("-inf"))
        return causal, sliding

    def forward(self, ids):
        cfg = self.cfg
        T = ids.shape[1]
        causal, sliding = self.masks(T)
        cos, sin = self.cos[:T], self.sin[:T]
        x = rms(self.token_embd(ids), cfg.rms_eps)
        for b in self.blocks:
            x = b(x, cos, sin, sliding if b.sliding else causal)
        z = self.output(rms(x, cfg.rms_eps) * self.output_norm).float()
        return cfg.softcap * torch.tanh(z * (cfg.logit_scale / cfg.softcap))
