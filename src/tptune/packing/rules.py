"""How each framework packs one step's sequences into micro-batches, and the padding each pads them with.

A *step* is the sequences one GPU trains per optimizer step (``seqs_per_step`` of them, drawn from the
lengths with a seeded RNG: ``draw_steps``). A rule turns a step into micro-batches (``Step``): the sequence
lengths in each, its real tokens and the tokens it computes on once padded. Three rules (docs/packing.md):

``fill``  fill-to-capacity bins padded to T: Megatron-RL's ``SequencePacker.pack_sequences`` as
          ``pack_all_trajectories(bin_size=args.seq_length)`` calls it (NVIDIA/Megatron-LM
          megatron/rl/sequence_packing_utils.py @ d98e8a64ddf34856e74b24714e3bedb2f5a39553): the sequences
          sorted by length, longest first (a stable sort: equal lengths keep their order), then *next-fit*:
          one open bin, a sequence goes in while the bin's tokens stay <= T and it holds fewer than
          ``--rl-sequence-packing-max-sequences-per-bin`` (default 50) sequences, else the bin closes and a
          new one opens (a closed bin is never revisited). Every bin is padded to T, micro-batch size 1
          (Megatron-LM asserts it with ``--rl-use-sequence-packing``). Context parallelism (slots rounded
          to 2*CP) is not modelled: CP 1.
``verl``  veRL's dynamic batch size, ``rearrange_micro_batches`` (volcengine/verl
          verl/utils/seqlen_balancing.py @ b178a3cd56f58b2d502255daba591e92833930a7): k = min(n,
          ceil(step tokens / max_token_len)) micro-batches, the sequences partitioned into k by
          Karmarkar-Karp (largest differencing, ``get_seqlen_balanced_partitions(equal_size=False)``) on
          the workload ``24576 L + L^2`` (``calculate_workload``), not on tokens: a micro-batch's tokens are
          not bounded by max_token_len (veRL PR #7272: they "routinely overshoot"). Then, with
          ``use_dynamic_bsz_balance`` (its default), ordered by workload, heaviest in the middle. Its Megatron
          engine pads each sequence to a multiple of TP (FP8: lcm(16, TP), and the micro-batch's total to a
          multiple of 128 TP: ``preprocess_packed_seqs`` in verl/models/mcore/util.py). veRL asserts
          max_token_len >= the longest sequence. DP = 1: veRL's max over DP ranks of k is not modelled.
``slime`` slime's dynamic batch size, ``--max-tokens-per-gpu`` (THUDM/slime slime/utils/dp_schedule.py,
          ``first_fit_pack`` in slime/utils/seqlen_balancing.py, @ 624b824a898ab0ec1fcb4d373004c7f3852bf515):
          *first-fit* in the step's order (no sort) into bins of at most max_tokens_per_gpu tokens (a longer
          sequence alone in its own bin); each micro-batch padded to a multiple of TP x
          ``--data-pad-size-multiplier`` (default 128: ``get_batch`` in slime/backends/megatron_utils/data.py).
          DP = 1 and CP = 1: the alignment of the micro-batch count to DP and ``--balance-by-flops`` are not
          modelled.

The frameworks' code is read, not copied: these are tptune's own implementations, tested against each
framework's documented behaviour and cases worked by hand (tests/packing/). None of the three installs on a
CPU without torch-on-GPU stacks (veRL needs ray/tensordict, slime sglang/ray, Megatron-RL megatron.training).
Speed: ``benchmarks/packing_speed.py`` packs a million lengths by each rule.
"""
from __future__ import annotations

import heapq
import math
from itertools import chain
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

RULES = ("fill", "verl", "slime")
MEGATRON_RL_MAX_SEQS = 50        # --rl-sequence-packing-max-sequences-per-bin's default (megatron/training/arguments)
SLIME_PAD_MULTIPLIER = 128       # --data-pad-size-multiplier's default (slime/utils/arguments.py)
VERL_WORKLOAD_LINEAR = 24576     # calculate_workload: 24576 * L + L**2 (12 h^2 L + 2 h L^2 at h = 4096, halved)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch: its sequences' lengths (in the rule's order) and the tokens it computes on."""
    lengths: tuple[int, ...]
    padded: int

    @property
    def real(self) -> int:
        return sum(self.lengths)

    @property
    def padding(self) -> int:
        return self.padded - self.real


@dataclass(frozen=True)
class Step:
    """One step's micro-batches under ``rule`` (``capacity``: T for fill, else None)."""
    rule: str
    micro_batches: tuple[MicroBatch, ...]
    capacity: int | None = None

    @property
    def count(self) -> int:
        return len(self.micro_batches)

    @property
    def real(self) -> int:
        return sum(mb.real for mb in self.micro_batches)

    @property
    def padded(self) -> int:
        return sum(mb.padded for mb in self.micro_batches)

    @property
    def padding_share(self) -> float:
        """Padding's share of the tokens computed on."""
        p = self.padded
        return (p - self.real) / p if p else 0.0

    def to_dict(self) -> dict:
        return {"rule": self.rule, "capacity": self.capacity,
                "micro_batches": [{"lengths": list(mb.lengths), "real": mb.real, "padded": mb.padded}
                                  for mb in self.micro_batches],
                "real": self.real, "padded": self.padded, "count": self.count}


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


# --- the rules, one step each ------------------------------------------------------------------------------

def fill(step_lengths: Sequence[int], capacity: int, max_sequences_per_bin: int = MEGATRON_RL_MAX_SEQS,
         packer: str = "megatron_rl") -> Step:
    """Fill-to-capacity bins, each padded to ``capacity``: ``packer`` "megatron_rl", Megatron-RL's next-fit
    decreasing (module doc); "slime", slime's own first-fit with ``--max-tokens-per-gpu T`` (what slime packs
    when set up for T: emit.slime). ValueError for a sequence longer than the capacity (Megatron-RL would
    write past its bin, slime would pad it to 2 T)."""
    lengths = _ints(step_lengths)
    if capacity < 1 or max_sequences_per_bin < 1:
        raise ValueError(f"capacity {capacity} and max_sequences_per_bin {max_sequences_per_bin} must be >= 1")
    if lengths and max(lengths) > capacity:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a bin of capacity {capacity}")
    if packer == "slime":
        bins = slime(lengths, capacity, 1, 1).micro_batches
        return Step("fill", tuple(MicroBatch(mb.lengths, capacity) for mb in bins), capacity)
    if packer != "megatron_rl":
        raise ValueError(f"unknown fill packer {packer!r} (expected megatron_rl or slime)")
    order = sorted(lengths, reverse=True)     # the lengths in Megatron-RL's order (a stable sort of indices)
    bins: list[MicroBatch] = []
    cur: list[int] = []
    used = 0
    for n in order:
        if used + n <= capacity and len(cur) < max_sequences_per_bin:
            cur.append(n)
            used += n
        else:
            if cur:
                bins.append(MicroBatch(tuple(cur), capacity))
            cur, used = [n], n
    if cur:
        bins.append(MicroBatch(tuple(cur), capacity))
    return Step("fill", tuple(bins), capacity)


def verl(step_lengths: Sequence[int], max_token_len: int, tp: int = 1, fp8: bool = False,
         balance: bool = True) -> Step:
    """veRL's dynamic batch size (module doc): Karmarkar-Karp into k micro-batches on the attention-weighted
    workload, padded as its Megatron engine pads. ValueError where veRL asserts (max_token_len below the
    longest sequence)."""
    lengths = _ints(step_lengths)
    if not lengths:
        return Step("verl", ())
    if max_token_len < max(lengths):
        raise ValueError(f"veRL asserts max_token_len >= the longest sequence: {max_token_len} < {max(lengths)}")
    k = min(len(lengths), -(-sum(lengths) // max_token_len))
    workloads = [VERL_WORKLOAD_LINEAR * n + n * n for n in lengths]
    parts = karmarkar_karp(workloads, k)
    if balance:
        parts.sort(key=lambda p: (sum(workloads[i] for i in p), p[0] if p else 0), reverse=True)
        parts = parts[::2][::-1] + parts[1::2]
    align = math.lcm(16, tp) if fp8 else tp
    out = []
    for p in parts:
        mb = tuple(lengths[i] for i in p)
        padded = sum(round_up(n, align) for n in mb)
        if fp8:
            padded = round_up(padded, tp * 128)
        out.append(MicroBatch(mb, padded))
    return Step("verl", tuple(out))


def slime(step_lengths: Sequence[int], max_tokens_per_gpu: int, tp: int = 1,
          pad_multiplier: int = SLIME_PAD_MULTIPLIER) -> Step:
    """slime's dynamic batch size (module doc): first-fit in order, each micro-batch padded to a multiple of
    TP x pad_multiplier."""
    lengths = _ints(step_lengths)
    bins: list[list[int]] = []
    sums: list[int] = []
    for n in lengths:
        for j, s in enumerate(sums):
            if s + n <= max_tokens_per_gpu:
                bins[j].append(n)
                sums[j] = s + n
                break
        else:
            bins.append([n])
            sums.append(n)
    m = tp * pad_multiplier
    return Step("slime", tuple(MicroBatch(tuple(b), round_up(s, m)) for b, s in zip(bins, sums)))


def karmarkar_karp(values: Sequence[int], k: int) -> list[list[int]]:
    """Indices of ``values`` in ``k`` partitions by the largest differencing method, as veRL's
    ``get_seqlen_balanced_partitions(values, k, equal_size=False)`` returns them: the final state's sets from
    the largest sum down, each partition's indices sorted. ValueError where veRL asserts (fewer values than
    k, an empty partition).

    veRL's algorithm: every value starts as a state of k sets (itself and k-1 empty ones); the two states of
    largest spread (largest minus smallest set; a tie: the one whose largest set is larger) are merged, set i
    of the first with set k-1-i of the second, the sets re-sorted from the largest down; until one state is
    left. Sets compare by (sum, item count, items) and states' items are disjoint, so the order is total: the
    pops are veRL's whatever the queue. Here a state keeps only its non-empty sets (the empty ones are the
    smallest, at the end), so a merge costs its non-empty sets, not k: a million values take seconds."""
    n = len(values)
    if k < 1 or n < k:
        raise ValueError(f"number of items:[{n}] < k_partitions:[{k}]")
    if k == 1:
        return [list(range(n))]
    # A set is one int, (sum, item count, first item's index) packed so that int order is veRL's set order
    # (sum, count, items): items of different sets are disjoint, so (count, items) compare by the first
    # index. Merging set b into set a adds the keys and drops b's first index; a set's first index never
    # changes, so the merges are recorded as (absorbed first index -> absorbing first index) and resolved
    # into partitions once, at the end.
    idx_bits = n.bit_length()
    len_shift, sum_shift = idx_bits, 2 * idx_bits + 1
    low = (1 << len_shift) - 1
    heap = []
    for i, v in enumerate(values):
        key = (v << sum_shift) | (1 << len_shift) | i
        heap.append((-v, -key, [key]))
    heapq.heapify(heap)            # (-spread, -largest set's key, the sets' keys from the largest down)
    absorbed: list[list[int]] = []
    into: list[list[int]] = []
    while len(heap) > 1:
        ka = heapq.heappop(heap)[2]
        kb = heapq.heappop(heap)[2]
        ma, mb = len(ka), len(kb)
        lo = k - mb                # set i of a meets set k-1-i of b where both exist: i in [lo, ma)
        if ma > lo:
            a_part, b_part = ka[lo:], kb[k - ma:][::-1]
            first_b = [b & low for b in b_part]
            absorbed.append(first_b)
            into.append([a & low for a in a_part])
            merged = ka[:lo] + [a + b - f for a, b, f in zip(a_part, b_part, first_b)] + kb[:k - ma][::-1]
        else:
            merged = ka + kb[::-1]
        merged.sort(reverse=True)
        spread = (merged[0] >> sum_shift) - (merged[-1] >> sum_shift if len(merged) == k else 0)
        heapq.heappush(heap, (-spread, -merged[0], merged))
    final = heap[0][2]
    if len(final) < k:
        raise ValueError(f"the {len(final)}-th partition is empty")
    parent = np.arange(n, dtype=np.int64)
    if absorbed:
        parent[np.fromiter(chain.from_iterable(absorbed), dtype=np.int64)] = \
            np.fromiter(chain.from_iterable(into), dtype=np.int64)
        while True:                # pointer jumping: every index to its set's first index
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt
    order = np.argsort(parent, kind="stable")
    bounds = np.flatnonzero(np.diff(parent[order])) + 1
    by_first = dict(zip(parent[order][np.r_[0, bounds]].tolist(), np.split(order, bounds)))   # sorted indices
    return [by_first[key & low].tolist() for key in final]


# --- steps -------------------------------------------------------------------------------------------------

def draw_steps(lengths: np.ndarray, seqs_per_step: int, rng: np.random.Generator | int,
               steps: int | None = None) -> np.ndarray:
    """Steps of ``seqs_per_step`` sequences, one row each. ``steps`` None: every length once, shuffled and cut
    into steps (the remainder dropped; fewer lengths than one step: one step drawn with replacement);
    ``steps`` given: that many steps drawn with replacement."""
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    lengths = np.asarray(lengths, dtype=np.int64)
    if seqs_per_step < 1 or lengths.size == 0:
        raise ValueError(f"seqs_per_step {seqs_per_step} and {lengths.size} lengths: need at least one of each")
    if steps is not None:
        return rng.choice(lengths, size=(steps, seqs_per_step), replace=True)
    whole = lengths.size // seqs_per_step
    if whole == 0:
        return rng.choice(lengths, size=(1, seqs_per_step), replace=True)
    return rng.permutation(lengths)[: whole * seqs_per_step].reshape(whole, seqs_per_step)


def pack(rule: str, step_lengths: Sequence[int], *, capacity: int | None = None, max_token_len: int | None = None,
         tp: int = 1, fp8: bool = False, max_sequences_per_bin: int = MEGATRON_RL_MAX_SEQS,
         packer: str = "megatron_rl") -> Step:
    """One step under ``rule``: fill needs ``capacity`` (T; ``packer``: fill's), verl and slime
    ``max_token_len`` (veRL's ppo_max_token_len_per_gpu, slime's --max-tokens-per-gpu)."""
    if rule == "fill":
        if capacity is None:
            raise ValueError("rule fill needs a capacity")
        return fill(step_lengths, capacity, max_sequences_per_bin, packer)
    if rule not in RULES:
        raise ValueError(f"unknown packing rule {rule!r} (expected one of {', '.join(RULES)})")
    if max_token_len is None:
        raise ValueError(f"rule {rule} needs max_token_len")
    if rule == "verl":
        return verl(step_lengths, max_token_len, tp, fp8)
    return slime(step_lengths, max_token_len, tp)


def pack_steps(lengths: np.ndarray, rule: str, *, seqs_per_step: int, rng: np.random.Generator | int = 0,
               steps: int | None = None, capacity: int | None = None, max_token_len: int | None = None,
               tp: int = 1, fp8: bool = False, packer: str = "megatron_rl") -> list[Step]:
    """``draw_steps`` then ``pack`` each: the steps a GPU trains under ``rule``. The same ``rng`` seed draws
    the same steps for every rule, so rules and capacities compare on the same sequences."""
    return [pack(rule, row.tolist(), capacity=capacity, max_token_len=max_token_len, tp=tp, fp8=fp8, packer=packer)
            for row in draw_steps(lengths, seqs_per_step, rng, steps)]


def fill_packer(rule: str) -> str:
    """The fill packer a framework's users get at T: slime's own first-fit for slime (emit.slime sets it up),
    Megatron-RL's next-fit decreasing otherwise (veRL has none of its own: emit.verl)."""
    return "slime" if rule == "slime" else "megatron_rl"


def summarize(steps: Iterable[Step]) -> dict:
    """Means per step (micro-batches, real and padded tokens), padding's share of the computed tokens and the
    largest micro-batch (``overshoot``: how many exceed a budget)."""
    steps = list(steps)
    if not steps:
        raise ValueError("no steps")
    padded = np.array([mb.padded for s in steps for mb in s.micro_batches], dtype=np.int64)
    real_total = sum(s.real for s in steps)
    padded_total = int(padded.sum())
    return {
        "rule": steps[0].rule, "capacity": steps[0].capacity, "steps": len(steps),
        "micro_batches_per_step": padded.size / len(steps),
        "real_per_step": real_total / len(steps),
        "padded_per_step": padded_total / len(steps),
        "padding_share": (padded_total - real_total) / padded_total if padded_total else 0.0,
        "largest_micro_batch": int(padded.max()) if padded.size else 0,
    }


def overshoot(steps: Iterable[Step], max_token_len: int) -> float:
    """Share of micro-batches whose real tokens exceed ``max_token_len`` (veRL's partition does not bound it)."""
    real = np.array([mb.real for s in steps for mb in s.micro_batches], dtype=np.int64)
    return float((real > max_token_len).mean()) if real.size else 0.0


# --- one representative bin for the GPU measurement -----------------------------------------------------------

def sample_bin(lengths: Sequence[int] | np.ndarray, capacity: int, rng: np.random.Generator | int) -> list[int]:
    """The sequence lengths of one fill-to-capacity bin that stands for the bins of a step: sequences drawn
    (with replacement) from ``lengths`` until about 16 bins' worth, packed by ``fill`` at ``capacity``, and
    the bin whose attention work is nearest the bins' mean (ties: the lower index). Attention work is the sum
    of squared segment lengths, the padding segment ``capacity - sum(lengths)`` included: Megatron-RL's
    cu_seqlens end each bin with it as one more segment (create_packed_seq_params_for_bin), so the worker
    pads the bin to ``capacity`` the same way. The GEMMs see ``capacity`` tokens in every bin; a step's time
    is bins x the mean bin's, so the bin nearest the mean stands for them. Lengths longer than ``capacity``
    are never drawn (ValueError where none fits)."""
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    pool = np.asarray(lengths, dtype=np.int64)
    pool = pool[pool <= capacity]
    if pool.size == 0:
        raise ValueError(f"no sequence fits capacity {capacity}")
    n = int(min(200_000, max(32, math.ceil(16 * capacity / float(pool.mean())))))
    bins = fill(rng.choice(pool, size=n, replace=True).tolist(), capacity).micro_batches
    work = np.array([sum(x * x for x in b.lengths) + (capacity - b.real) ** 2 for b in bins], dtype=np.float64)
    i = int(np.argmin(np.abs(work - work.mean())))
    return list(bins[i].lengths)


def _ints(xs: Sequence[int] | np.ndarray) -> list[int]:
    return xs.tolist() if isinstance(xs, np.ndarray) else [int(x) for x in xs]
