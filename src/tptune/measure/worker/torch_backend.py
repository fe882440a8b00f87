"""Plain-PyTorch TP linear layers with sequence parallelism; overlap by splitting into N chunks.

Layout: the sequence-parallel input of a rank is its contiguous slice of T/tp tokens. With N chunks
each rank's slice is cut into N pieces of c = T/(tp·N) tokens; chunk i gathers piece i of every rank,
so chunk i holds rows [r, i, :] of the token layout [tp, N, c]. Chunk i's collective is issued
asynchronously and runs while chunk i+1's GEMM computes (seed 004).

Column-parallel (qkv, fc1):  y = AG(x) @ W^T           backward: dx = RS(dy @ W), dW = dy^T @ AG(x)
Row-parallel (proj, fc2):    y = RS(x @ W^T)           backward: dx = AG(dy) @ W, dW = AG(dy)^T @ x
Variants: none (sync collectives), nocomm (collectives replaced by local copies: the bound),
chunked.n<N>.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.profiler import record_function

from tptune.cases import Case
from tptune.model.spec import ModelConfig
from tptune.model.ops import parallel_kind, weight_shape
from tptune.measure.worker.bench import Bench
from tptune.measure.worker.context import TORCH_DTYPES, RankContext


class Comm:
    """Collectives over the TP group along dim 0, or local stand-ins for the no-communication bound."""

    def __init__(self, group, world: int, enabled: bool):
        self.group, self.world, self.enabled = group, world, enabled
        self.corrupt_dgrad = False   # a planted fault (planted_corruption): tests of the numerics check

    def all_gather(self, x: torch.Tensor, async_op=False):
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))
        if not self.enabled:
            out.view(self.world, *x.shape).copy_(x.unsqueeze(0).expand(self.world, *x.shape))
            return out, None
        with record_function("tptune.comm.all_gather"):
            work = dist.all_gather_into_tensor(out, x.contiguous(), group=self.group, async_op=async_op)
        return out, work

    def reduce_scatter(self, x: torch.Tensor, async_op=False):
        out = x.new_empty((x.shape[0] // self.world, *x.shape[1:]))
        if not self.enabled:
            out.copy_(x.view(self.world, -1, *x.shape[1:]).sum(0))
            return out, None
        with record_function("tptune.comm.reduce_scatter"):
            work = dist.reduce_scatter_tensor(out, x.contiguous(), group=self.group, async_op=async_op)
        return out, work


def planted_corruption(fault: str | None, rank: int) -> bool:
    """The fault "corrupt_dgrad[:<rank>]" (settings faults): that rank's column ops sum their own share
    of the input gradient twice, as a bulk communicator run as a reduce-scatter corrupts it on GPUs."""
    what, _, who = (fault or "").partition(":")
    return what == "corrupt_dgrad" and (not who or int(who) == rank)


def _wait(work):
    if work is not None:
        with record_function("tptune.comm.wait"):
            work.wait()


def _chunk_rows(full: torch.Tensor, world: int, chunks: int, i: int) -> torch.Tensor:
    """Rows [:, i, :] of a [world*chunks*c, ...] tensor laid out as [world, chunks, c, ...]."""
    c = full.shape[0] // (world * chunks)
    return full.view(world, chunks, c, *full.shape[1:])[:, i].reshape(world * c, *full.shape[1:])


def _gather_matmul(x_local, w, comm: Comm, chunks: int):
    """AG(x_local) @ w^T with the gather of chunk i+1 in flight during chunk i's GEMM."""
    world = comm.world
    if chunks == 1:
        full, work = comm.all_gather(x_local)
        _wait(work)
        return full @ w.t(), full
    pieces = x_local.chunk(chunks, dim=0)
    c = pieces[0].shape[0]
    gathered = [comm.all_gather(p, async_op=True) for p in pieces]
    out = x_local.new_empty((world, chunks, c, w.shape[0]))
    full = x_local.new_empty((world, chunks, c, x_local.shape[1]))
    for i, (g, work) in enumerate(gathered):
        _wait(work)
        gv = g.view(world, c, -1)
        out[:, i] = (g @ w.t()).view(world, c, -1)
        full[:, i] = gv
    return out.view(world * chunks * c, -1), full.view(world * chunks * c, -1)


def _matmul_scatter(a, w, comm: Comm, chunks: int):
    """RS(a @ w^T) with chunk i's reduce-scatter in flight during chunk i+1's GEMM."""
    if chunks == 1:
        out, work = comm.reduce_scatter(a @ w.t())
        _wait(work)
        return out
    pending = []
    for i in range(chunks):
        part = _chunk_rows(a, comm.world, chunks, i) @ w.t()
        pending.append(comm.reduce_scatter(part, async_op=True))
    outs = []
    for out, work in pending:
        _wait(work)
        outs.append(out)
    return torch.cat(outs, dim=0)


class ColumnParallelSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_local, w, comm, chunks):
        y, _ = _gather_matmul(x_local, w, comm, chunks)
        ctx.save_for_backward(x_local, w)
        ctx.comm, ctx.chunks = comm, chunks
        return y

    @staticmethod
    def backward(ctx, dy):
        x_local, w = ctx.saved_tensors
        comm, chunks = ctx.comm, ctx.chunks
        # Re-gather the input for wgrad (as Megatron does) while dgrad computes.
        x_full, ag_work = comm.all_gather(x_local, async_op=chunks > 1)
        dx = _matmul_scatter(dy, w.t(), comm, chunks)
        if comm.corrupt_dgrad:   # the rank's own partial input gradient summed twice
            dx = dx + (dy @ w).view(comm.world, -1, dx.shape[-1])[dist.get_rank(comm.group)]
        _wait(ag_work)
        dw = dy.t() @ x_full
        return dx, dw, None, None


class RowParallelSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, comm, chunks):
        ctx.save_for_backward(x, w)
        ctx.comm, ctx.chunks = comm, chunks
        return _matmul_scatter(x, w, comm, chunks)

    @staticmethod
    def backward(ctx, dy_local):
        x, w = ctx.saved_tensors
        dx, dy_full = _gather_matmul(dy_local, w.t(), ctx.comm, ctx.chunks)
        dw = dy_full.t() @ x
        return dx, dw, None, None


class TorchOpBench(Bench):
    """One op's TP layer on one rank: a norm (column ops, as TELayerNormColumnParallelLinear) + linear."""

    def __init__(self, case: Case, mc: ModelConfig, ctx: RankContext, seed: int = 1234,
                 shape: tuple[int, int] | None = None):
        kind = case.variant.kind
        if kind not in ("none", "nocomm", "chunked"):
            raise ValueError(f"torch backend runs variants none, nocomm, chunked.n<N>; got {case.variant_id}")
        self.case, self.ctx = case, ctx
        tp, tokens = case.tp, mc.workload.tokens
        self.chunks = case.variant.chunks if kind == "chunked" else 1
        if tokens % (tp * self.chunks):
            raise ValueError(f"{case.id}: tokens={tokens} not divisible by tp*chunks={tp * self.chunks}")
        dtype = TORCH_DTYPES[mc.workload.dtype]
        self.comm = Comm(ctx.group, tp, enabled=kind != "nocomm")
        self.column = parallel_kind(case.op) == "column"
        k_in, n_out = shape or weight_shape(case.op, mc)   # shape: one of the op's shapes (harness)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        if self.column:
            w_full = torch.randn(n_out, k_in, generator=gen) / k_in ** 0.5
            w = w_full.view(tp, n_out // tp, k_in)[ctx.rank]
            x = torch.randn(tokens, k_in, generator=gen).view(tp, tokens // tp, k_in)[ctx.rank]
            self.norm_weight = torch.ones(k_in, device=ctx.device, dtype=dtype, requires_grad=True)
        else:
            w_full = torch.randn(n_out, k_in, generator=gen) / k_in ** 0.5
            w = w_full.view(n_out, tp, k_in // tp)[:, ctx.rank]
            x = torch.randn(tokens, k_in, generator=gen).view(tokens, tp, k_in // tp)[:, ctx.rank]
            self.norm_weight = None
        self.weight = w.contiguous().to(ctx.device, dtype).requires_grad_(True)
        self.x = x.contiguous().to(ctx.device, dtype).requires_grad_(True)
        self.out = None
        self.grad_out = None

    def forward(self):
        x = self.x
        if self.column:
            x = torch.nn.functional.layer_norm(x, (x.shape[-1],), self.norm_weight)
            self.out = ColumnParallelSP.apply(x, self.weight, self.comm, self.chunks)
        else:
            self.out = RowParallelSP.apply(x, self.weight, self.comm, self.chunks)
        if self.grad_out is None:
            gen = torch.Generator(device="cpu").manual_seed(99 + self.ctx.rank)
            self.grad_out = torch.randn(self.out.shape, generator=gen).to(self.out.device, self.out.dtype)
        return self.out

    def grad_params(self):
        return [p for p in (self.weight, self.norm_weight) if p is not None]

    def gradients(self) -> dict[str, torch.Tensor]:
        grads = {"input": self.x.grad, "weight": self.weight.grad}
        if self.norm_weight is not None:
            grads["norm_weight"] = self.norm_weight.grad
        return grads


def build(case: Case, mc: ModelConfig, ctx: RankContext, settings: dict):
    """One op's bench (the layer stage's block: harness.build_bench)."""
    shape = settings.get("shape")
    return TorchOpBench(case, mc, ctx, shape=tuple(shape) if shape else None)
