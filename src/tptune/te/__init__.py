"""Transformer Engine and Megatron-core knowledge: ub_cfgs rules, methods, FP8 rules, flags, presets."""
