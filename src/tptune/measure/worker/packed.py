"""A layer case on packed THD input (cases.Pack: "layer-tp<N>-pack<T>.b<k>-<variant>"), what both
backends' blocks share: the bin's segments, the workload the block is built for, attention per segment,
the record, and the forward-only view the harness times beside fwd+bwd.

The T tokens hold the bin's sequences one after another, then one padding segment (T - their sum),
attention causal within each segment (Megatron-RL's bins: the padding is a sequence of its own,
cu_seqlens [0, l1, l1 + l2, ..., sum, T]). The block is built for seq_length T, micro-batch 1 (userbuffers
sized for T x hidden); each rank holds T / TP of the tokens (sequence parallel).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tptune.cases import Case, PackError
from tptune.measure.worker.bench import Bench
from tptune.model.spec import ModelConfig


@dataclass(frozen=True)
class PackedInput:
    """The packed input of one case: the bin's sequence lengths and the segments of its T tokens."""
    bin: int
    tokens: int                     # T
    lengths: tuple[int, ...]        # the real sequences
    segments: tuple[int, ...]       # lengths, then the padding segment where there is one

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding(self) -> int:
        return self.tokens - self.real_tokens

    @property
    def cu_seqlens(self) -> list[int]:
        out = [0]
        for n in self.segments:
            out.append(out[-1] + n)
        return out

    @property
    def max_seqlen(self) -> int:
        return max(self.segments)

    def record(self) -> dict:
        """What a member's run.json keeps of its input (``pack``)."""
        return {"bin": self.bin, "tokens": self.tokens, "real_tokens": self.real_tokens, "padding": self.padding,
                "sequences": len(self.lengths), "max_seqlen": self.max_seqlen, "lengths": list(self.lengths)}


def packed_input(case: Case, settings: dict) -> PackedInput | None:
    """The packed input of ``case`` from settings["layer"]["bins"][<bin>], or None for a case on one
    causal sequence per sample. ValueError naming what is missing or wrong."""
    if case.pack is None:
        return None
    bins = (settings.get("layer") or {}).get("bins") or {}
    if case.pack.key not in bins:
        raise ValueError(f"{case.id}: the session's settings give no bin {case.pack.bin} (layer.bins: "
                         f"{sorted(bins) or 'none'})")
    try:
        segments = case.pack.segments(bins[case.pack.key])
    except PackError as exc:
        raise ValueError(f"{case.id}: {exc}") from None
    n = len(bins[case.pack.key])
    return PackedInput(case.pack.bin, case.pack.tokens, segments[:n], segments)


def packed_model(mc: ModelConfig, pack: PackedInput | None) -> ModelConfig:
    """The model config a packed block is built with: seq_length T, micro-batch 1 (unchanged without one)."""
    if pack is None:
        return mc
    return replace(mc, workload=replace(mc.workload, seq_length=pack.tokens, micro_batch_size=1))


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments) -> torch.Tensor:
    """Causal attention within each segment of the tokens, nothing across them: q [t, heads, d], k and v
    [t, groups, d] (GQA: each group serves heads / groups query heads) -> [t, heads * d]. One
    scaled_dot_product_attention per segment, so memory grows with the longest segment, not with the bin."""
    h, g = q.shape[1], k.shape[1]
    if g != h:
        k, v = (x.repeat_interleave(h // g, dim=1) for x in (k, v))
    out, start = [], 0
    for n in segments:
        qs, ks, vs = (x[start:start + n].transpose(0, 1) for x in (q, k, v))   # [heads, n, d]
        out.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
        start += n
    if start != q.shape[0]:
        raise RuntimeError(f"segments cover {start} tokens, the input has {q.shape[0]}")
    o = torch.cat(out)
    return o.reshape(o.shape[0], h * o.shape[-1])


class SegmentAttention(torch.nn.Module):
    """Stands in for a Megatron-core layer's core attention (TEDotProductAttention) in the te backend's
    higher-precision reference of a packed block: per-segment attention in the reference's precision
    (segment_attention). TE would run an fp32 THD attention unfused, padding every segment to the
    longest: (segments x longest^2) scores per head, hundreds of GB for a long-tailed bin at T 16384."""

    def __init__(self, segments):
        super().__init__()
        self.segments = tuple(segments)

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if query.dim() == 4:   # [t, 1, heads, d]: Megatron squeezes the batch of a THD input; accept either
            query, key, value = (x.squeeze(1) for x in (query, key, value))
        return segment_attention(query, key, value, self.segments)


class ForwardOnly(Bench):
    """A bench's forward alone under torch.no_grad() (RL's log-prob and reference passes): what the
    harness times as ``fwd_only_ms`` with the same timing code as fwd+bwd. Its backward does nothing, so a
    timed iteration's fwd_ms is the forward's time."""

    def __init__(self, bench: Bench):
        self.bench = bench
        self.x, self.grad_out = bench.x, bench.grad_out

    def forward(self):
        with torch.no_grad():
            self.bench.forward()
        self.bench.out = None
        return None

    def backward(self) -> None:
        pass

    def zero_grad(self) -> None:
        pass

    def grad_params(self):
        return ()
