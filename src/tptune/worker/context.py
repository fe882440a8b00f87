"""What a backend needs to know about the rank it runs on."""
from __future__ import annotations

from dataclasses import dataclass

import torch

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    group: object            # the TP process group (NCCL on GPU, gloo on CPU)
    cpu_group: object        # a gloo group for control messages

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
