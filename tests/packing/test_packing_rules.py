"""The packing rules against each framework's documented behaviour and cases worked by hand (tptune.packing.rules)."""
import functools
import random

import numpy as np
import pytest

from tptune.packing import rules


def lengths_of(step):
    return [mb.lengths for mb in step.micro_batches]


# --- fill: Megatron-RL's next-fit decreasing, padded to T ------------------------------------------------------

def test_fill_is_next_fit_decreasing():
    # sorted [8, 7, 5, 3, 2] into T = 10: 8 | 7 (8+7 > 10) | 5 (7+5 > 10), 3, 2. A closed bin is never revisited:
    # first-fit decreasing would have put 2 beside 8 and 3 beside 7.
    step = rules.fill([5, 3, 8, 2, 7], 10)
    assert lengths_of(step) == [(8,), (7,), (5, 3, 2)]
    assert [mb.padded for mb in step.micro_batches] == [10, 10, 10]
    assert (step.real, step.padded, step.count) == (25, 30, 3)
    assert step.padding_share == pytest.approx(5 / 30)


def test_fill_caps_sequences_per_bin():
    # --rl-sequence-packing-max-sequences-per-bin closes a bin at the cap even with room left
    assert lengths_of(rules.fill([1] * 5, 10, max_sequences_per_bin=2)) == [(1, 1), (1, 1), (1,)]
    assert rules.MEGATRON_RL_MAX_SEQS == 50
    assert rules.fill([1] * 120, 1000).count == 3          # 50 + 50 + 20


def test_fill_by_slimes_first_fit():
    # slime set up for T (--max-tokens-per-gpu T, --data-pad-size-multiplier T / TP): its first-fit, padded to T
    step = rules.fill([5, 3, 8, 2, 7], 10, packer="slime")
    assert lengths_of(step) == [(5, 3, 2), (8,), (7,)] and step.padded == 30
    assert rules.fill_packer("slime") == "slime" and rules.fill_packer("verl") == "megatron_rl"


def test_fill_refuses_a_sequence_longer_than_the_capacity():
    with pytest.raises(ValueError, match="does not fit"):
        rules.fill([100, 20], 64)


# --- slime: first-fit in order, padded to TP x 128 ----------------------------------------------------------------

def test_slime_documented_example():
    # slime's --use-dynamic-batch-size help: lengths 100, 200, 300 with max_tokens_per_gpu 300 make
    # 2 micro batches, [100, 200] and [300]
    step = rules.slime([100, 200, 300], 300)
    assert lengths_of(step) == [(100, 200), (300,)]
    assert [mb.padded for mb in step.micro_batches] == [384, 384]     # TP 1 x 128
    assert [mb.padded for mb in rules.slime([100, 200, 300], 300, tp=2).micro_batches] == [512, 512]


def test_slime_first_fit_keeps_order_and_an_oversized_sample_alone():
    # first fit, no sort: 250 opens bin 0; 100 fits nowhere (250 + 100 > 300): bin 1; 50 goes to bin 0 (first fit)
    assert lengths_of(rules.slime([250, 100, 50, 500, 200], 300)) == [(250, 50), (100, 200), (500,)]


# --- verl: Karmarkar-Karp on the attention workload ---------------------------------------------------------------

def naive_kk(values, k):
    """veRL's largest differencing method written plainly from its description (states of k sets; sets compare
    by (sum, count, items of (index, value)); the state of largest spread, then of larger largest set, first)."""
    def set_key(s):
        return (sum(v for _, v in s), len(s), s)

    def cmp_state(a, b):             # -1: a is popped before b
        sa, sb = spread(a), spread(b)
        if sa != sb:
            return -1 if sa > sb else 1
        ka, kb = set_key(a[0]), set_key(b[0])
        return -1 if ka > kb else (1 if ka < kb else 0)

    def spread(st):
        return set_key(st[0])[0] - set_key(st[-1])[0]

    states = [sorted([[(i, v)]] + [[] for _ in range(k - 1)], key=set_key, reverse=True)
              for i, v in enumerate(values)]
    while len(states) > 1:
        states.sort(key=functools.cmp_to_key(cmp_state))
        a, b = states.pop(0), states.pop(0)
        merged = [a[i] + b[k - 1 - i] for i in range(k)]
        states.append(sorted(merged, key=set_key, reverse=True))
    return [sorted(i for i, _ in s) for s in states[0]]


def test_karmarkar_karp_by_hand():
    # 5,4,3,2,1 into 2: {5}{4} -> [5|4]; {3}{2} -> [3|2]; [5|4] with [3|2] -> [5+2 | 4+3]; then {1} -> [1+5+2 | 4+3]
    assert rules.karmarkar_karp([5, 4, 3, 2, 1], 2) == [[0, 3, 4], [1, 2]]
    assert rules.karmarkar_karp([7, 7, 7], 3) == [[2], [1], [0]]
    assert rules.karmarkar_karp([3, 1], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="k_partitions"):
        rules.karmarkar_karp([1, 2], 3)


def test_karmarkar_karp_matches_the_plain_algorithm_with_ties():
    rnd = random.Random(7)
    for _ in range(150):
        n = rnd.randint(1, 24)
        k = rnd.randint(1, n)
        values = [rnd.choice([1, 2, 3, 5, 8, 8, 13, 21, rnd.randint(1, 60)]) for _ in range(n)]
        assert rules.karmarkar_karp(values, k) == naive_kk(values, k), (values, k)


def test_verl_micro_batches_by_hand():
    # total 100 over max_token_len 40: k = 3. Workloads 24576 L + L^2; KK gives {40} {30} {20, 10}; the balance
    # order sorts them by workload ({40} > {30} > {20, 10}) and puts the heaviest in the middle: [::2][::-1] + [1::2]
    step = rules.verl([10, 20, 30, 40], 40)
    assert lengths_of(step) == [(10, 20), (40,), (30,)]
    assert lengths_of(rules.verl([10, 20, 30, 40], 40, balance=False)) == [(40,), (30,), (10, 20)]


def test_verl_overshoots_its_budget():
    # veRL PR #7272: micro-batches "routinely overshoot" max_token_len. 10000 + 4 x 3000 = 22000 tokens, budget
    # 11000: k = 2, and KK balances workloads (345.8M against 4 x 82.7M), not tokens: {10000} and 12000 tokens
    step = rules.verl([10000, 3000, 3000, 3000, 3000], 11000, balance=False)
    assert sorted(mb.real for mb in step.micro_batches) == [10000, 12000]
    assert rules.overshoot([step], 11000) == 0.5
    with pytest.raises(ValueError, match="max_token_len >= the longest"):
        rules.verl([5000], 4096)


def test_verl_padding_follows_its_megatron_engine():
    # preprocess_packed_seqs: each sequence to a multiple of TP; FP8: lcm(16, TP), the total to 128 x TP
    assert rules.verl([101, 7], 1000, tp=2).micro_batches[0].padded == 102 + 8
    assert rules.verl([101, 7], 1000, tp=2, fp8=True).micro_batches[0].padded == 256      # 112 + 16 -> 256
    assert rules.verl([101], 1000, tp=1).micro_batches[0].padded == 101


# --- steps and the representative bin -----------------------------------------------------------------------------

def test_steps_are_seeded_and_shared_by_the_rules():
    lengths = np.arange(1, 1001, dtype=np.int64)
    a = rules.draw_steps(lengths, 64, 3)
    assert a.shape == (15, 64) and np.array_equal(a, rules.draw_steps(lengths, 64, 3))
    assert len(set(a.ravel().tolist())) == a.size               # every length at most once
    assert rules.draw_steps(lengths, 64, 3, steps=40).shape == (40, 64)
    assert rules.draw_steps(lengths[:10], 64, 3).shape == (1, 64)
    fill = rules.pack_steps(lengths, "fill", seqs_per_step=64, rng=3, capacity=4096)
    slime = rules.pack_steps(lengths, "slime", seqs_per_step=64, rng=3, max_token_len=2048)
    assert [s.real for s in fill] == [s.real for s in slime]     # the same sequences, step by step
    summary = rules.summarize(fill)
    assert summary["steps"] == 15 and summary["padded_per_step"] == 4096 * summary["micro_batches_per_step"]
    with pytest.raises(ValueError, match="unknown packing rule"):
        rules.pack("ffd", [1], capacity=4)


def test_sample_bin_is_a_seeded_bin_near_the_mean():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(100, 1000, 5000), rng.integers(3000, 9000, 1000)])
    b = rules.sample_bin(lengths, 8192, 11)
    assert b == rules.sample_bin(lengths, 8192, np.random.default_rng(11))
    assert 0 < sum(b) <= 8192 and b == sorted(b, reverse=True) and len(b) <= rules.MEGATRON_RL_MAX_SEQS
    assert max(rules.sample_bin(lengths, 1024, 1)) <= 1024       # longer sequences are never drawn
    with pytest.raises(ValueError, match="no sequence fits"):
        rules.sample_bin([5000], 4096, 0)
