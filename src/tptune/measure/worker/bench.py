"""The bench protocol: one case built on one rank, as worker.harness drives it on every backend.

Its life (harness): built (the constructor), warmed up, timed and profiled by fwd+bwd iterations
(forward, backward, zero_grad), checked once against its no-overlap reference where the run asks
(correctness), closed. The backends' benches: torch_backend.TorchOpBench and torch_block.TorchBlockBench,
te_backend.TeOpBench and te_block.TeBlockBench (both on te_common.TeBench).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch


class Bench(ABC):
    """An op's TP layer or a whole block on one rank: its input ``x`` (a leaf that takes a gradient), the
    output gradient ``grad_out`` it is driven with, and the last forward's output ``out`` until backward."""

    x: torch.Tensor
    grad_out: torch.Tensor
    out: torch.Tensor | None = None

    @abstractmethod
    def forward(self) -> torch.Tensor:
        """One forward on the bench's input; keeps and returns its output."""

    @abstractmethod
    def grad_params(self) -> Iterable[torch.Tensor]:
        """The weights whose gradients an iteration computes (the input's aside)."""

    def backward(self) -> None:
        """Backward of the last forward from ``grad_out``."""
        self.out.backward(self.grad_out)
        self.out = None

    def zero_grad(self) -> None:
        self.x.grad = None
        for p in self.grad_params():
            p.grad = None

    def correctness(self) -> dict | None:
        """The numerics check (stats.numerics), or None for a bench without one."""
        return None

    def close(self) -> None:
        """Release what the bench holds (every rank at once: it may be collective)."""
        self.out = None
