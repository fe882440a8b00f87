# Written by tptune 0.1.0; tuned for: model mistral-small-24b, workload seq_length=8192 micro_batch_size=1 dtype=bf16
# TP 2
"""TP comm/GEMM overlap chosen by tptune, for Megatron-Bridge and NeMo 2.

Megatron-Bridge (a ConfigContainer ``cfg``):
    from megatron.bridge.training.comm_overlap import CommOverlapConfig
    import tp_overlap_cfg_nemo as tuned
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=tuned.tp_overlap_cfg)
    for k, v in tuned.model_overrides.items():
        setattr(cfg.model, k, v)
NeMo 2 (a recipe): the same overrides on ``recipe.model.config``, and the callback
    MegatronCommOverlapCallback(tp_comm_overlap=True, tp_comm_overlap_cfg=tuned.tp_overlap_cfg)
(nemo.lightning.pytorch.callbacks.megatron_comm_overlap). Check that your NeMo drops None entries
before TE (Bridge does) when a wgrad below is None.
Transformer Engine alone: initialize_ub(..., ub_cfgs=tuned.ub_cfgs()).
"""

from dataclasses import asdict, dataclass, field, fields, make_dataclass

try:                                            # Megatron-Bridge
    from megatron.bridge.training.comm_overlap import (BulkOverlapCfg, PipelineOverlapCfg,
                                                       RingExchangeOverlapCfg, TransformerLayerTPOverlapCfg)
except ImportError:
    try:                                        # NeMo 2
        from nemo.collections.llm.recipes.tp_overlap_configs.userbuffers import (
            BulkOverlapCfg, PipelineOverlapCfg, RingExchangeOverlapCfg, TransformerLayerTPOverlapCfg)
    except ImportError:                         # neither: stand-ins, enough for ub_cfgs() and TE
        @dataclass
        class RingExchangeOverlapCfg:
            method: str = "ring_exchange"

        @dataclass
        class PipelineOverlapCfg:
            method: str = "pipeline"

        @dataclass
        class BulkOverlapCfg:
            method: str = "bulk"

        TransformerLayerTPOverlapCfg = make_dataclass("TransformerLayerTPOverlapCfg", [
            "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad", "qkv_fprop",
            "proj_dgrad", "fc1_fprop", "fc2_dgrad", "proj_fprop", "fc2_fprop"])


def _overlap(base, **knobs):
    """``base`` holding every knob given; a knob ``base`` has no field for becomes a field of a
    subclass defined in this module (asdict, which Bridge and NeMo hand to TE, keeps it)."""
    extra = tuple(k for k in knobs if k not in {f.name for f in fields(base)})
    if not extra:
        return base(**knobs)
    name = "_".join((base.__name__, "with", *extra))
    if name not in globals():
        cls = make_dataclass(name, [(k, type(knobs[k]), field(default=knobs[k])) for k in extra],
                             bases=(base,))
        cls.__module__ = __name__
        globals()[name] = cls
    return globals()[name](**knobs)


tp_overlap_cfg = TransformerLayerTPOverlapCfg(
    qkv_fprop=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    qkv_dgrad=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    qkv_wgrad=None,   # reduce-scatter dgrad: TE takes no qkv_wgrad entry
    proj_fprop=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    proj_dgrad=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    fc1_fprop=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    fc1_dgrad=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    fc1_wgrad=None,   # reduce-scatter dgrad: TE takes no fc1_wgrad entry
    fc2_fprop=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
    fc2_dgrad=_overlap(RingExchangeOverlapCfg, num_sm=1, cga_size=1, set_sm_margin=False, aggregate=False, use_ce=True),
)

# TransformerConfig (GPTModelProvider / NeMo GPTConfig) fields the overlap needs
model_overrides = {
    'sequence_parallel': True,
    'tp_comm_overlap': True,
    'tp_comm_bulk_wgrad': False,
    'tp_comm_bulk_dgrad': False,
    'tp_comm_overlap_ag': True,
    'tp_comm_overlap_rs': True,
    'tp_comm_overlap_rs_dgrad': True,
    'tp_comm_overlap_disable_qkv': False,
    'tp_comm_overlap_disable_fc1': False,
}


def ub_cfgs() -> dict:
    """The ub_cfgs TE's initialize_ub receives from Megatron-Bridge: asdict, None entries left out."""
    return {name: cfg for name, cfg in asdict(tp_overlap_cfg).items() if cfg is not None}
