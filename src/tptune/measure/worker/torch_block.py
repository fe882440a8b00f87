"""A whole transformer block on the torch backend (runs anywhere, gloo on CPU): the te backend's
layer stage built from this backend's own sequence-parallel layers.

Per layer (pre-norm GPT, as Megatron's): x + proj(attn(qkv(norm(x)))), then h + fc2(act(fc1(norm(h)))),
with qkv/fc1 column-parallel (all-gather in, sequence-parallel out of fc2/proj by reduce-scatter),
attention by torch's scaled_dot_product_attention (causal) on the rank's heads, GQA by repeating
the rank's key/value groups, SwiGLU when the MLP is gated. An MoE model's block has its MoE
layers (ModelSpec.block_pattern): router, top-k routed experts over the rank's expert shards and the
shared expert (``_moe``). Variants as for the ops: none, nocomm
(collectives replaced by local stand-ins: the bound), chunked.n<N> (every op split into N chunks).

A packed case ("layer-tp<N>-pack<T>.b<k>-<variant>", worker.packed): the block of T tokens, micro-batch 1,
attention causal within each of the bin's sequences and the padding segment (packed.segment_attention:
block-diagonal), as Megatron-core's THD path on the te backend.
"""
from __future__ import annotations

import torch

from tptune.cases import Case, make_case
from tptune.model.spec import ModelConfig
from tptune.measure.worker.bench import Bench
from tptune.measure.worker.context import TORCH_DTYPES, RankContext
from tptune.measure.worker import numerics
from tptune.measure.worker.packed import packed_input, packed_model, segment_attention
from tptune.measure.worker.torch_backend import ColumnParallelSP, Comm, RowParallelSP, planted_corruption

DEFAULT_LAYERS = 2


class _Gather(torch.autograd.Function):
    """All-gather of the sequence-parallel tokens (backward: reduce-scatter), outside any overlap."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_gather(x)[0]

    @staticmethod
    def backward(ctx, g):
        return ctx.comm.reduce_scatter(g.contiguous())[0], None


class _Scatter(torch.autograd.Function):
    """Reduce-scatter of partial sums back to sequence-parallel tokens (backward: all-gather)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.reduce_scatter(x)[0]

    @staticmethod
    def backward(ctx, g):
        return ctx.comm.all_gather(g.contiguous())[0], None


class TorchBlockBench(Bench):
    def __init__(self, case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, seed: int = 1234,
                 dtype: torch.dtype | None = None):
        kind = case.variant.kind
        if kind not in ("none", "nocomm", "chunked"):
            raise ValueError(f"{case.id}: the torch backend's layer runs none, nocomm or chunked.n<N>")
        self.pack = packed_input(case, settings)
        mc = packed_model(mc, self.pack)
        m, w = mc.model, mc.workload
        tp = case.tp
        self.chunks = case.variant.chunks if kind == "chunked" else 1
        if w.tokens % (tp * self.chunks):
            raise ValueError(f"{case.id}: tokens={w.tokens} not divisible by tp*chunks={tp * self.chunks}")
        self.case, self.mc, self.settings, self.kind = case, mc, settings, kind
        self.ctx, self.m, self.tp = ctx, m, tp
        self.layers = int((settings.get("layer") or {}).get("num_layers", DEFAULT_LAYERS))
        self.comm = Comm(ctx.group, tp, enabled=kind != "nocomm")
        self.comm.corrupt_dgrad = planted_corruption(settings.get("fault"), ctx.rank)
        self.heads, self.groups = m.num_attention_heads // tp, m.num_query_groups // tp
        self.s, self.b = w.seq_length, w.micro_batch_size
        dt = self.dtype = dtype or TORCH_DTYPES[w.dtype]
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def shard(n_out, k_in, column):  # the rank's slice of a full weight [n_out, k_in]
            full = torch.randn(n_out, k_in, generator=gen) / k_in ** 0.5
            part = full.view(tp, n_out // tp, k_in)[ctx.rank] if column else full.view(n_out, tp, k_in // tp)[:, ctx.rank]
            return part.contiguous().to(ctx.device, dt).requires_grad_(True)

        halves = 2 if m.gated_mlp else 1

        def fc1(width):  # the rank's fc1 rows: its gate shard, then its up shard, when gated
            return torch.cat([shard(width, m.hidden_size, True) for _ in range(halves)]).detach().requires_grad_(True)

        self.params = []
        self.moe = m.block_pattern(self.layers)
        for i in range(self.layers):
            q, kv = m.q_size, m.kv_size
            # the qkv weight's rows per rank: the rank's q heads, then its k and v groups
            qkv = torch.cat([shard(q, m.hidden_size, True), shard(kv, m.hidden_size, True),
                             shard(kv, m.hidden_size, True)]).detach().requires_grad_(True)
            layer = {"norm1": torch.ones(m.hidden_size, device=ctx.device, dtype=dt, requires_grad=True),
                     "qkv": qkv, "proj": shard(m.hidden_size, q, False),
                     "norm2": torch.ones(m.hidden_size, device=ctx.device, dtype=dt, requires_grad=True),
                     "fc1": fc1(m.ffn_hidden_size),
                     "fc2": shard(m.hidden_size, m.ffn_hidden_size, False)}
            if self.moe[i]:   # router (replicated), routed experts (each TP-sharded: ETP = TP), shared expert
                for k in ("fc1", "fc2"):
                    del layer[k]
                e, ew = m.num_moe_experts, m.moe_ffn_hidden_size
                layer["router"] = (torch.randn(e, m.hidden_size, generator=gen) / m.hidden_size ** 0.5).to(
                    ctx.device, dt).requires_grad_(True)
                layer["experts_fc1"] = torch.stack([fc1(ew) for _ in range(e)]).detach().requires_grad_(True)
                layer["experts_fc2"] = torch.stack([shard(m.hidden_size, ew, False) for _ in range(e)]
                                                   ).detach().requires_grad_(True)
                sw = m.moe_shared_expert_intermediate_size
                if sw:
                    layer["shared_fc1"] = fc1(sw)
                    layer["shared_fc2"] = shard(m.hidden_size, sw, False)
            self.params.append(layer)
        x = torch.randn(w.tokens, m.hidden_size, generator=gen).view(tp, w.tokens // tp, m.hidden_size)[ctx.rank]
        self.x = x.contiguous().to(ctx.device, dt).requires_grad_(True)
        g = torch.Generator(device="cpu").manual_seed(99)  # the full gradient, so any TP sees the same one
        full = torch.randn(w.tokens, m.hidden_size, generator=g).view(tp, w.tokens // tp, m.hidden_size)
        self.grad_out = full[ctx.rank].contiguous().to(ctx.device, dt)
        self.out = None
        f = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
             "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
             "relu": torch.relu, "squared_relu": lambda t: torch.relu(t) ** 2}[m.activation_name]

        def gated(h):
            gate, up = h.chunk(2, dim=-1)
            return f(gate) * up
        self._act = gated if m.gated_mlp else f   # the MLP's nonlinearity, resolved once, not per forward

    def _norm(self, x, w):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=1e-5)

    def _attention(self, qkv):
        """qkv [tokens, (heads + 2 groups) * d] of this rank -> [tokens, heads * d], causal per sequence."""
        d, h, g = self.m.kv_channels, self.heads, self.groups
        q, k, v = qkv.split([h * d, g * d, g * d], dim=-1)
        if self.pack is not None:   # [T, n*d]: one sample of T tokens, attention within each segment
            return segment_attention(q.view(-1, h, d), k.view(-1, g, d), v.view(-1, g, d), self.pack.segments)

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
            hn = self._norm(x, p["norm2"])
            if "router" in p:
                x = x + self._moe(hn, p)
            else:
                x = x + self._mlp(hn, p["fc1"], p["fc2"])
        self.out = x
        return x

    def _mlp(self, hn, w1, w2):
        """fc1/fc2 under TP (the ops tptune tunes): a dense MLP or the shared expert."""
        h = ColumnParallelSP.apply(hn, w1, self.comm, self.chunks)
        return RowParallelSP.apply(self._act(h), w2, self.comm, self.chunks)

    def _moe(self, hn, p):
        """An MoE layer as Megatron's with the all-gather token dispatcher and ETP = TP: all-gather the
        sequence-parallel tokens, route each to its top-k experts (softmax router, probabilities
        renormalised over the k), every rank runs its shard of each expert on that expert's tokens,
        reduce-scatter the weighted sum; plus the shared expert through fc1/fc2. The routed part is
        never chunked: it runs outside TP comm overlap, as in Megatron-core."""
        full = _Gather.apply(hn, self.comm)
        probs = torch.softmax(full.float() @ p["router"].float().t(), dim=-1)
        top_p, top_i = probs.topk(self.m.moe_router_topk, dim=-1)
        top_p = (top_p / top_p.sum(-1, keepdim=True)).to(full.dtype)
        out = torch.zeros_like(full)
        for e in range(self.m.num_moe_experts):
            tok, slot = (top_i == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self._act(full[tok] @ p["experts_fc1"][e].t()) @ p["experts_fc2"][e].t()
            out = out.index_add(0, tok, y * top_p[tok, slot].unsqueeze(-1))
        routed = _Scatter.apply(out, self.comm)
        if "shared_fc1" in p:
            routed = routed + self._mlp(hn, p["shared_fc1"], p["shared_fc2"])
        return routed

    def grad_params(self):
        return (t for p in self.params for t in p.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """One fwd+bwd: the output, the input gradient and every weight gradient, by name."""
        self.zero_grad()
        out = self.forward()
        out.backward(self.grad_out)
        got = {"output": out.detach().clone(), "input_grad": self.x.grad.detach().clone()}
        for i, p in enumerate(self.params):
            got.update((f"layers.{i}.{k}", t.grad.detach().clone()) for k, t in p.items())
        self.zero_grad()
        self.out = None
        return got

    def reference(self, dtype: torch.dtype) -> "TorchBlockBench":
        """The no-overlap block in ``dtype`` with this block's weights, input and output gradient (upcast
        exactly: a bf16 weight is the same number in fp32)."""
        ref = TorchBlockBench(make_case(self.case.op, self.tp, "none", self.case.pack), self.mc, self.ctx,
                              {k: v for k, v in self.settings.items() if k != "fault"}, dtype=dtype)
        with torch.no_grad():
            for mine, theirs in zip(self.params, ref.params):
                for k, t in mine.items():
                    theirs[k] = t.detach().to(dtype).requires_grad_(True)
        ref.x = self.x.detach().to(dtype).requires_grad_(True)
        ref.grad_out = self.grad_out.to(dtype)
        return ref

    def correctness(self) -> dict:
        """Against the no-overlap block in higher precision (stats.numerics): the output, the input
        gradient and every weight gradient; the bound (nocomm) is no computation of the block: finite."""
        test = self.tensors()
        dev, group = self.ctx.device, self.ctx.group
        if self.kind == "nocomm":
            return {"ok": numerics.finite(test, group, dev), "reference": None,
                    "checked": "finite output and gradients (the bound: collectives replaced by local copies)"}
        precision = numerics.TORCH_PRECISION[self.dtype]
        hp = self.reference(numerics.higher_dtype(precision)).tensors()
        same = self.reference(self.dtype).tensors()   # built afresh, even for none: a planted fault stays out
        base = numerics.errors(same, hp, group, dev)
        return numerics.verdict(test, base, hp, group, dev, precision,
                                reference=f"the same block without overlap in {numerics.HIGHER[precision]}")
