"""What a backend needs to know about the rank it runs on."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# The torch dtype of params and of the activations between GEMMs. fp8 keeps them bf16: on the te backend
# TE quantizes inside its modules (under the workload's recipe); on the torch backend, which has no
# FP8 GEMMs, an FP8 workload runs only with workload.fp8_emulation: bf16 (settings.resolve refuses it
# otherwise), i.e. entirely in bf16.
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.bfloat16}


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
