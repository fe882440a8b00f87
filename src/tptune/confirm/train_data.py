"""The data the confirm stage trains on: deterministic, learnable token samples, the same in every launch of a
stage (so the loss check compares like with like), and packed THD micro-batches for RL workloads.

``ProgressionSamples``: sample i is an arithmetic progression of token ids modulo the first 1024 ids, its start and
small step drawn from (seed, i). The loss falls from log(vocab) within a few iterations (the model first learns
which ids occur), so a wrong gradient shows in the loss and grad norm curves; uniform random tokens over the
whole vocabulary left the loss at log(vocab) whatever the gradients did (seen on an H200: 12.59 to 12.56 over
20 iterations).

``PackedSamples``: micro-batch i is one bin of whole sequences (bins are not reused within a launch: the stage
draws one per micro-batch; reused bins let the model memorise them) (their lengths given, e.g. drawn from the user's
rollout lengths and packed by tptune.packing) laid end to end and padded to the capacity T with one padding
segment: ``cu_seqlens`` marks every sequence, the padding segment included, so attention stays within each
sequence (THD), and the loss mask is 0 on the padding. Position ids restart at each sequence.

Only torch is imported here: the same samples are built and tested on CPU.
"""
from __future__ import annotations

import torch


LEARNABLE_IDS = 1024      # tokens come from the first ids only: the loss falls from log(vocab) within iterations


def _progression(seed: int, index: int, length: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    ids = min(vocab, LEARNABLE_IDS)
    start = int(torch.randint(0, ids, (1,), generator=g))
    step = int(torch.randint(1, max(2, min(ids, 8)), (1,), generator=g))
    return (start + step * torch.arange(length + 1, dtype=torch.int64)) % ids


class ProgressionSamples(torch.utils.data.Dataset):
    """``num_samples`` samples of ``seq_length`` tokens (module doc); each a dict of Megatron's GPT batch keys."""

    def __init__(self, num_samples: int, seq_length: int, vocab_size: int, seed: int):
        if num_samples < 1 or seq_length < 2 or vocab_size < 2:
            raise ValueError(f"num_samples {num_samples}, seq_length {seq_length}, vocab_size {vocab_size}: "
                             "at least 1, 2 and 2")
        self.n, self.seq, self.vocab, self.seed = num_samples, seq_length, vocab_size, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        t = _progression(self.seed, int(i), self.seq, self.vocab)
        return {"tokens": t[:-1], "labels": t[1:], "loss_mask": torch.ones(self.seq, dtype=torch.float32),
                "position_ids": torch.arange(self.seq, dtype=torch.int64)}


def pack_bin(lengths: list[int], capacity: int, seed: int, index: int, vocab: int) -> dict:
    """One packed micro-batch: the sequences of ``lengths`` end to end, one padding segment to ``capacity``."""
    if not lengths or any(n < 1 for n in lengths):
        raise ValueError(f"bin {index}: sequence lengths must be positive integers, got {lengths}")
    real = sum(lengths)
    if real > capacity:
        raise ValueError(f"bin {index}: {real} tokens exceed the capacity {capacity}")
    tokens, labels, mask, pos, cu = [], [], [], [], [0]
    for j, n in enumerate(lengths):
        t = _progression(seed, index * 4099 + j, n, vocab)
        tokens.append(t[:-1])
        labels.append(t[1:])
        m = torch.ones(n, dtype=torch.float32)
        m[-1] = 0.0                    # the last token's label belongs to no sequence
        mask.append(m)
        pos.append(torch.arange(n, dtype=torch.int64))
        cu.append(cu[-1] + n)
    pad = capacity - real
    if pad:
        tokens.append(torch.zeros(pad, dtype=torch.int64))
        labels.append(torch.zeros(pad, dtype=torch.int64))
        mask.append(torch.zeros(pad, dtype=torch.float32))
        pos.append(torch.arange(pad, dtype=torch.int64))
        cu.append(capacity)
    return {"tokens": torch.cat(tokens), "labels": torch.cat(labels), "loss_mask": torch.cat(mask),
            "position_ids": torch.cat(pos), "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "max_seqlen": torch.tensor(max(lengths + ([pad] if pad else [])), dtype=torch.int32),
            "real_tokens": torch.tensor(real, dtype=torch.int64)}


class PackedSamples(torch.utils.data.Dataset):
    """Packed micro-batches (module doc), one per bin of ``bins`` (lists of sequence lengths), cycled to
    ``num_samples``; every bin padded to ``capacity`` tokens."""

    def __init__(self, bins: list[list[int]], capacity: int, num_samples: int, vocab_size: int, seed: int):
        if not bins:
            raise ValueError("no packed bins")
        for k, b in enumerate(bins):
            if sum(b) > capacity:
                raise ValueError(f"bin {k}: {sum(b)} tokens exceed the capacity {capacity}")
        self.bins, self.capacity, self.n, self.vocab, self.seed = bins, capacity, num_samples, vocab_size, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        k = int(i) % len(self.bins)
        return pack_bin(self.bins[k], self.capacity, self.seed, k, self.vocab)
