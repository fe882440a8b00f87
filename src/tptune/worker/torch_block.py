"""A whole transformer block on the torch backend (runs anywhere, gloo on CPU): the te backend's
layer stage built from this backend's own sequence-parallel layers.

Per layer (pre-norm GPT, as Megatron's): x + proj(attn(qkv(norm(x)))), then h + fc2(act(fc1(norm(h)))),
with qkv/fc1 column-parallel (all-gather in, sequence-parallel out of fc2/proj by reduce-scatter),
attention by torch's scaled_dot_product_attention (causal) on the rank's heads, GQA by repeating
the rank's key/value groups, SwiGLU when the MLP is gated. Variants as for the ops: none, nocomm
(collectives replaced by local stand-ins: the bound), chunked.n<N> (every op split into N chunks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..cases import Case
from ..model import ModelConfig
from .context import TORCH_DTYPES, RankContext
from .torch_backend import ColumnParallelSP, RowParallelSP, _Comm

DEFAULT_LAYERS = 2


class TorchBlockBench:
    def __init__(self, case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, seed: int = 1234):
        kind = case.variant.kind
        if kind not in ("none", "nocomm", "chunked"):
            raise ValueError(f"{case.id}: the torch backend's layer runs none, nocomm or chunked.n<N>")
        m, w = mc.model, mc.workload
        tp = case.tp
        self.chunks = case.variant.chunks if kind == "chunked" else 1
        if w.tokens % (tp * self.chunks):
            raise ValueError(f"{case.id}: tokens={w.tokens} not divisible by tp*chunks={tp * self.chunks}")
        self.ctx, self.m, self.tp = ctx, m, tp
        self.layers = int((settings.get("layer") or {}).get("num_layers", DEFAULT_LAYERS))
        self.comm = _Comm(ctx.group, tp, enabled=kind != "nocomm")
        self.heads, self.groups = m.num_attention_heads // tp, m.num_query_groups // tp
        self.s, self.b = w.seq_length, w.micro_batch_size
        dt = TORCH_DTYPES[w.dtype]
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def shard(n_out, k_in, column):  # the rank's slice of a full weight [n_out, k_in]
            full = torch.randn(n_out, k_in, generator=gen) / k_in ** 0.5
            part = full.view(tp, n_out // tp, k_in)[ctx.rank] if column else full.view(n_out, tp, k_in // tp)[:, ctx.rank]
            return part.contiguous().to(ctx.device, dt).requires_grad_(True)

        self.params = []
        for _ in range(self.layers):
            q, kv = m.q_size, m.kv_size
            # the qkv weight's rows per rank: the rank's q heads, then its k and v groups
            qkv = torch.cat([shard(q, m.hidden_size, True), shard(kv, m.hidden_size, True),
                             shard(kv, m.hidden_size, True)]).detach().requires_grad_(True)
            layer = {"norm1": torch.ones(m.hidden_size, device=ctx.device, dtype=dt, requires_grad=True),
                     "qkv": qkv, "proj": shard(m.hidden_size, q, False),
                     "norm2": torch.ones(m.hidden_size, device=ctx.device, dtype=dt, requires_grad=True),
                     "fc1": shard(m.fc1_out, m.hidden_size, True) if not m.gated_mlp else torch.cat(
                         [shard(m.ffn_hidden_size, m.hidden_size, True),
                          shard(m.ffn_hidden_size, m.hidden_size, True)]).detach().requires_grad_(True),
                     "fc2": shard(m.hidden_size, m.ffn_hidden_size, False)}
            self.params.append(layer)
        x = torch.randn(w.tokens, m.hidden_size, generator=gen).view(tp, w.tokens // tp, m.hidden_size)[ctx.rank]
        self.x = x.contiguous().to(ctx.device, dt).requires_grad_(True)
        g = torch.Generator(device="cpu").manual_seed(99)  # the full gradient, so any TP sees the same one
        full = torch.randn(w.tokens, m.hidden_size, generator=g).view(tp, w.tokens // tp, m.hidden_size)
        self.grad_out = full[ctx.rank].contiguous().to(ctx.device, dt)
        self.out = None

    def _norm(self, x, w):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=1e-5)

    def _attention(self, qkv):
        """qkv [tokens, (heads + 2 groups) * d] of this rank -> [tokens, heads * d], causal per sequence."""
        d, h, g = self.m.kv_channels, self.heads, self.groups
        q, k, v = qkv.split([h * d, g * d, g * d], dim=-1)

        def heads(t, n):  # [s*b, n*d] -> [b, n, s, d]  (tokens are s-major: [s, b])
            return t.view(self.s, self.b, n, d).permute(1, 2, 0, 3)
        q, k, v = heads(q, h), heads(k, g), heads(v, g)
        if g != h:
            k, v = (t.repeat_interleave(h // g, dim=1) for t in (k, v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.permute(2, 0, 1, 3).reshape(self.s * self.b, h * d)

    def forward(self):
        x = self.x
        for p in self.params:
            a = ColumnParallelSP.apply(self._norm(x, p["norm1"]), p["qkv"], self.comm, self.chunks)
            x = x + RowParallelSP.apply(self._attention(a), p["proj"], self.comm, self.chunks)
            h = ColumnParallelSP.apply(self._norm(x, p["norm2"]), p["fc1"], self.comm, self.chunks)
            if self.m.gated_mlp:
                gate, up = h.chunk(2, dim=-1)
                h = torch.nn.functional.silu(gate) * up
            else:
                h = torch.nn.functional.gelu(h)
            x = x + RowParallelSP.apply(h, p["fc2"], self.comm, self.chunks)
        self.out = x
        return x

    def backward(self):
        self.out.backward(self.grad_out)
        self.out = None

    def zero_grad(self):
        self.x.grad = None
        for p in self.params:
            for t in p.values():
                t.grad = None

    def correctness(self) -> dict:
        self.zero_grad()
        out = self.forward()
        out.backward(self.grad_out)
        finite = bool(torch.isfinite(out).all()) and bool(torch.isfinite(self.x.grad).all())
        self.zero_grad()
        flag = torch.tensor([0.0 if finite else 1.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.ctx.cpu_group)
        return {"ok": bool(flag.item() == 0.0), "reference": None, "checked": "finite output and input gradient"}

    def close(self):
        self.out = None
