"""Packed, variable-length micro-batches for RL training engines (issue 53; docs/packing.md).

TE userbuffers hold one fixed token count T, so packed micro-batches must be padded to a capacity T to use
TP overlap. This package models that on the CPU, from values only: ``lengths`` (the per-sequence token
counts of the user's rollouts), ``capacity`` (the candidate T), ``rules`` (how Megatron-RL, veRL and slime
pack a step's sequences into micro-batches, and the fill-to-capacity bins), ``ub_memory`` (the userbuffers'
bytes at T), ``decide`` (does overlap pay after the padding) and ``emit`` (what each framework needs).
"""
