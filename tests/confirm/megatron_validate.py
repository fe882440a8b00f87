"""Run in a subprocess by test_confirm_command.py: Megatron-LM's own parse_args + validate_args
(megatron/training/arguments.py, megatron-core 0.19.2) on each argv of the JSON list given as the script's one
argument (a path), as rank 0 of WORLD_SIZE ranks (the argv's --tensor-model-parallel-size: one replica). Two things a CPU-only host lacks are stood in for, nothing else: the GPU's compute capability
(Hopper, 9.0: the lent H100/H200) and, on Python < 3.12, typing.override (megatron-core requires 3.12).
Prints the parsed values the test checks, as JSON, one line per argv."""
import json
import sys
import typing

if not hasattr(typing, "override"):
    import typing_extensions
    typing.override = typing_extensions.override

import torch

torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
import megatron.training.arguments as arguments  # noqa: E402

arguments.get_device_arch_version = lambda: 9
import os  # noqa: E402

from tptune.confirm.command import add_tptune_args  # noqa: E402

KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "swiglu", "seq_length", "micro_batch_size", "global_batch_size", "tensor_model_parallel_size",
        "data_parallel_size", "sequence_parallel", "tp_comm_overlap", "tp_comm_overlap_cfg", "tp_comm_bulk_wgrad",
        "tp_comm_bulk_dgrad", "tp_comm_overlap_rs_dgrad", "tp_comm_overlap_ag", "tp_comm_overlap_rs", "bf16",
        "fp8", "fp8_recipe", "num_experts", "padded_vocab_size", "vocab_size", "tokenizer_type", "mock_data",
        "train_iters", "gradient_accumulation_fusion", "timing_log_level", "untie_embeddings_and_output_weights",
        "tptune_timing", "tptune_data_seed", "tptune_packed")

with open(sys.argv[1]) as f:
    argvs = json.load(f)
for argv in argvs:
    os.environ["WORLD_SIZE"] = argv[argv.index("--tensor-model-parallel-size") + 1]
    sys.argv = ["pretrain_gpt.py"] + argv
    # tptune's training entry (confirm.trainer) parses with its own options added and NullTokenizer's default
    args = arguments.parse_args(extra_args_provider=add_tptune_args)
    arguments.validate_args(args, {"tokenizer_type": "NullTokenizer"})
    print("PARSED " + json.dumps({k: getattr(args, k, None) for k in KEYS}), flush=True)
