"""The userbuffers' memory at a capacity T: what turning overlap on costs each GPU.

Read at NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b: ``initialize_ub``
(transformer_engine/pytorch/module/base.py) creates one communicator for each of twelve GEMM names, the
ten that ub_cfgs tunes and the two ``external`` wgrads (proj_wgrad, fc2_wgrad), whatever the config
leaves out; each allocates a buffer for the ``shape`` Megatron-LM passes, ``[seq_length * micro_batch_size /
context_parallel_size, hidden_size]`` (megatron/training/initialize.py ``_initialize_tp_communicators``),
that is T x hidden elements (comm_gemm_overlap.cpp):

- ``CommOverlapBase`` (pipeline, bulk, external): T x hidden;
- ``CommOverlapP2PBase`` (ring_exchange): an all-gather T x hidden (TP chunks of T / TP rows); a
  reduce-scatter ``2 TP - 1`` chunks of T / TP rows, (2 TP - 1) / TP x T x hidden.

An element is the high-precision dtype's (bf16: 2 bytes), or one byte where the buffer is FP8: in FP8 mode
TE makes the all-gather buffers FP8 (``layers_all_gather_overlap``: qkv/fc1 fprop and dgrad, proj/fc2 dgrad
and wgrad), and a pipelined GEMM FP8 where its ``fp8_buf`` says so; a qkv/fc1 dgrad given a reduce-scatter
method (rs_dgrad) leaves that list and its wgrad leaves the reduce-scatter list. Twelve buffers of about T x
hidden: a 70B model (hidden 8192) at T = 8192 holds 12 x 8192 x 8192 x 2 B = 1.5 GiB per GPU, whatever TP.
Not counted: the transient output buffer a ring-exchange all-gather GEMM allocates per call, counters,
NVLink multicast's mappings.
"""
from __future__ import annotations

from tptune.model.ops import TE_GEMMS
from tptune.te.ubcfg import allowed_methods, is_rs_dgrad

GIB = 1024 ** 3
EXTERNAL = ("proj_wgrad", "fc2_wgrad")
# initialize_ub's roles before a config moves anything (base.py layers_*_overlap)
_ALL_GATHER = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad",
               "fc2_wgrad")
_REDUCE_SCATTER = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")


def buffers(tokens: int, hidden: int, tp: int, *, dtype_bytes: int = 2, fp8: bool = False,
            ub_cfgs: dict | None = None) -> dict[str, int]:
    """Bytes of each of the twelve communicators' buffers on one GPU (module doc), by GEMM name."""
    cfgs = ub_cfgs or {}
    methods = {n: (cfgs.get(n) or {}).get("method") or allowed_methods(n)[0] for n in TE_GEMMS}
    methods.update({n: "external" for n in EXTERNAL})
    ag, rs = set(_ALL_GATHER), set(_REDUCE_SCATTER)
    for dgrad in ("qkv_dgrad", "fc1_dgrad"):
        if is_rs_dgrad(dgrad, methods[dgrad]):
            ag.discard(dgrad)
            rs.add(dgrad)
            rs.discard(dgrad.replace("dgrad", "wgrad"))
    out = {}
    for name, method in methods.items():
        fp8_buf = name in ag or (bool((cfgs.get(name) or {}).get("fp8_buf")) and method == "pipeline")
        element = 1 if fp8 and fp8_buf else dtype_bytes
        rows = tokens * (2 * tp - 1) // tp if method == "ring_exchange" and name in rs else tokens
        out[name] = rows * hidden * element
    return out


def ub_bytes(tokens: int, hidden: int, tp: int, *, dtype_bytes: int = 2, fp8: bool = False,
             ub_cfgs: dict | None = None) -> int:
    """The userbuffers' bytes on one GPU at ``tokens`` (= T x micro-batch size / CP) (module doc)."""
    return sum(buffers(tokens, hidden, tp, dtype_bytes=dtype_bytes, fp8=fp8, ub_cfgs=ub_cfgs).values())
