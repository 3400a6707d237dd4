"""Tiny modules with TorchTitan-Qwen3 / Parallax parameter names for optimizer tests."""

import torch
import torch.nn as nn


class TinyAttention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, head_dim, gate=True):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wr = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.q_norm = nn.RMSNorm(head_dim)
        self.k_norm = nn.RMSNorm(head_dim)
        self.r_norm = nn.RMSNorm(head_dim)
        self.gate = nn.Linear(dim, n_heads, bias=False) if gate else None

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_norm(self.wq(x).view(b, t, self.n_heads, self.head_dim))
        k = self.k_norm(self.wk(x).view(b, t, self.n_kv_heads, self.head_dim))
        r = self.r_norm(self.wr(x).view(b, t, self.n_heads, self.head_dim))
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        if self.gate is not None:
            r = r * torch.sigmoid(self.gate(x)).unsqueeze(-1)
        att = torch.softmax(torch.einsum("bthd,bshd->bhts", q + r, k) / self.head_dim**0.5, -1)
        return self.wo(torch.einsum("bhts,bshd->bthd", att, v).reshape(b, t, -1))


class TinyFFN(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class TinyBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, head_dim, hidden):
        super().__init__()
        self.attention = TinyAttention(dim, n_heads, n_kv_heads, head_dim)
        self.feed_forward = TinyFFN(dim, hidden)
        self.attention_norm = nn.RMSNorm(dim)
        self.ffn_norm = nn.RMSNorm(dim)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class TinyParallax(nn.Module):
    """vocab 32, dim 16, 2 layers, 4/2 heads of 4, FFN 24, tied output."""

    def __init__(self, vocab=32, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, hidden=24, tied=True):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): TinyBlock(dim, n_heads, n_kv_heads, head_dim, hidden)
                                     for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))
