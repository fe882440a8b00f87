"""tptune's training entry for the confirm stage: a GPT model of the run's real shapes built from Megatron-core's
Transformer Engine layer specs, tptune's own data (confirm.train_data), a forward step and a loss, handed to
``megatron.training.pretrain`` of the installed megatron-core, so the training loop (optimizer, schedules,
gradient reduction, logging) is Megatron's own and runs unmodified.

Arguments are Megatron-LM's (parsed and validated by megatron.training.arguments) plus tptune's own group:
  --tptune-timing FILE   rank 0 writes the launch's GPU-timed iterations there (JSON, below)
  --tptune-packed FILE   train on packed THD micro-batches: a JSON {"capacity": T, "bins": [[len, ...], ...]}
                         (micro-batch size 1, seq length T): confirm.train_data.PackedSamples
  --tptune-data-seed N   the data's seed (the same in every launch of a stage)

GPU-timed iterations: a CUDA event is recorded when the first micro-batch of each iteration enters the forward
step, so consecutive events span one whole iteration as the GPU ran it (forward, backward, gradient reduction,
optimizer step), free of the host-side jitter of the training log's per-iteration time; the SM clock (NVML) is
read beside each event. The JSON: {"iteration_ms": [...], "sm_mhz": [...], "micro_batches": m}; entry i is
iteration i+1.

Run as a script by torch.distributed.run (``python -m torch.distributed.run ... -m tptune.confirm.trainer``), or
in-process by confirm.rank_runner after its imports. Imports megatron and TE at module level: only GPU machines
(and the rank runner) import this module.
"""
from __future__ import annotations

import json
import sys
import time
from functools import partial

import torch
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                      get_gpt_layer_with_transformer_engine_spec)
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.training import get_args, pretrain
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import core_transformer_config_from_args, parse_and_validate_args

from tptune.confirm.command import add_tptune_args
from tptune.confirm.train_data import PackedSamples, ProgressionSamples


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """GPTModel of the parsed arguments' shapes on Megatron-core's TE layer specs (MoE layers laid out by
    --moe-layer-freq through the decoder block spec)."""
    args = get_args()
    config = config or core_transformer_config_from_args(args)
    if args.num_experts:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=True, normalization=args.normalization,
                                          qk_l2_norm=args.qk_l2_norm, vp_stage=vp_stage)
    else:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=args.qk_layernorm)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
                    post_process=post_process, parallel_output=True,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                    rotary_base=args.rotary_base, pg_collection=pg_collection, vp_stage=vp_stage)


def datasets_provider(train_val_test_num_samples, vp_stage=None):
    """(train, None, None): every rank builds the same deterministic samples (no broadcast needed)."""
    args = get_args()
    n = max(1, int(train_val_test_num_samples[0]))
    if args.tptune_packed:
        with open(args.tptune_packed) as f:
            spec = json.load(f)
        train = PackedSamples(spec["bins"], int(spec["capacity"]), n, args.padded_vocab_size, args.tptune_data_seed)
    else:
        train = ProgressionSamples(n, args.seq_length, args.padded_vocab_size, args.tptune_data_seed)
    return train, None, None


datasets_provider.is_distributed = True      # built on every rank, as Megatron's GPT script does


class IterationClock:
    """CUDA events (and NVML SM clock reads) at the first micro-batch of every iteration (module doc)."""

    def __init__(self, micro_batches: int):
        from tptune.measure.worker.gpu_clock import open_clock

        self.micro_batches, self.calls, self.events, self.mhz = micro_batches, 0, [], []
        self.clock = open_clock(torch.device("cuda", torch.cuda.current_device()))

    def tick(self) -> None:
        if self.calls % self.micro_batches == 0:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.events.append(ev)
            s = self.clock.sample() if self.clock else None
            self.mhz.append(s[0] if s else None)
        self.calls += 1

    def record(self) -> dict:
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        return {"iteration_ms": ms, "sm_mhz": self.mhz[:len(ms)], "micro_batches": self.micro_batches}


_CLOCK: IterationClock | None = None


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Summed token loss over the unmasked tokens, their count, and the report Megatron logs as ``lm loss``."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    tokens = mask.sum().clone().detach().to(torch.int)
    return loss, tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), tokens.view(1)])}


def forward_step(data_iterator, model):
    global _CLOCK
    args = get_args()
    if _CLOCK is None:
        _CLOCK = IterationClock(args.global_batch_size // (args.micro_batch_size * args.data_parallel_size))
    _CLOCK.tick()
    batch = {k: v.cuda(non_blocking=True) for k, v in next(data_iterator).items()}
    packed = None
    if "cu_seqlens" in batch:
        cu = batch["cu_seqlens"].view(-1)
        mx = int(batch["max_seqlen"].max())
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                                 cu_seqlens_kv_padded=cu, max_seqlen_q=mx, max_seqlen_kv=mx)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"], packed_seq_params=packed)
    return out, partial(loss_func, batch["loss_mask"])


def use_prebuilt_dataset_helpers() -> None:
    """Rank 0's initialisation runs ``make`` in megatron/core/datasets to build the dataset helpers, and the
    megatron-core wheel ships them prebuilt (``helpers_cpp``) but no Makefile, so make fails and the launch exits
    before the model is built. Where the prebuilt helpers import, the build is skipped (and said so); elsewhere
    Megatron's own build runs as before."""
    from megatron.core.datasets import utils

    build = utils.compile_helpers

    def compile_helpers():
        try:
            from megatron.core.datasets import helpers_cpp  # noqa: F401
        except ImportError:
            return build()
        print("> tptune: megatron.core.datasets.helpers_cpp imports (the wheel's prebuilt build): no make", flush=True)

    utils.compile_helpers = compile_helpers


def main(argv: list[str] | None = None) -> None:
    use_prebuilt_dataset_helpers()
    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    args = parse_and_validate_args(extra_args_provider=add_tptune_args,
                                   args_defaults={"tokenizer_type": "NullTokenizer"})
    cfg = pretrain_cfg_container_from_args(args, None)    # no model config: the model comes from model_provider
    t0 = time.time()
    pretrain(cfg, datasets_provider, ModelType.encoder_or_decoder, forward_step, model_provider=model_provider)
    if _CLOCK is not None and args.tptune_timing and torch.distributed.get_rank() == 0:
        rec = {**_CLOCK.record(), "pretrain_s": round(time.time() - t0, 2)}
        with open(args.tptune_timing, "w") as f:
            json.dump(rec, f)
    print("> tptune: training done", flush=True)


if __name__ == "__main__":
    main()
