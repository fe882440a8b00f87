"""Run in a subprocess by test_bridge_comm_overlap.py, with .cache/megatron-bridge/site and a megatron-core on
PYTHONPATH: each emitted tp_overlap_cfg_nemo.tp<N>.py of the JSON listing (the script's one argument, a path)
through Megatron-Bridge 0.3.1's own code, then Transformer Engine 2.20.2's own initialize_ub on what Bridge hands
TE and on the run's ub_cfgs.tp<N>.json. Prints one JSON line per item ("RESULT {...}") for the test to judge.

Bridge, as a user runs it (training/config.py runtime_config_update, then model.finalize() in validate):
GPTModelProvider with the model's shapes at TP N, the module's model_overrides set on it,
CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=tuned.tp_overlap_cfg).finalize() and
.setup(model, OptimizerConfig(), DistributedDataParallelConfig()); model.tp_comm_overlap_cfg is then the dict
training/initialize.py _initialize_tp_communicators hands initialize_ub.

What stands in, and why (nothing else does):
  - megatron/bridge/__init__.py and megatron/bridge/models/__init__.py are not run: both import AutoBridge, whose
    peft/lora_layers.py does `import transformer_engine.pytorch`, which needs TE's CUDA extension
    (transformer_engine_torch is a source-only package built against CUDA: it cannot be installed on a CPU host).
    The two packages are registered with their real folders, so every module the test uses is Bridge's own file;
    megatron.bridge.models gets the two names comm_overlap imports from it (GPTModelProvider, T5ModelProvider),
    taken from Bridge's gpt_provider.py and t5_provider.py.
  - comm_overlap.HAVE_TE is set True: Bridge sets it from `import transformer_engine`, which fails here, and then
    setup turns TP overlap off ("TE not detected").
  - In TE's base.py (read from the transformer-engine 2.20.2 wheel, its initialize_ub and the module globals it
    uses executed as written) the C++ extension transformer_engine_torch is a recorder: CommOverlap/CommOverlapP2P
    record their arguments instead of building communicators, the stream priority range is H100/H200's (0, -5),
    multicast is supported, Userbuffers is not built with MPI. torch.distributed is real (gloo, one rank);
    bootstrap is gloo because the CPU torch has no NCCL (Bridge passes its default, "nccl", checked by the test).
"""
import ast
import dataclasses
import enum
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import types
import typing
import warnings
from pathlib import Path

if not hasattr(typing, "override"):       # megatron-core 0.19.2 requires Python 3.12 (see test_confirm_command.py)
    import typing_extensions
    typing.override = typing_extensions.override

import torch

SITE = Path(os.environ["TPTUNE_BRIDGE_SITE"])
TE_BASE = Path(os.environ["TPTUNE_TE_BASE"])


def bridge():
    """megatron.bridge.training.comm_overlap, Bridge's own, with the stand-ins of the module doc."""
    import megatron
    root = SITE / "megatron" / "bridge"
    for name, path in (("megatron.bridge", root), ("megatron.bridge.models", root / "models")):
        pkg = types.ModuleType(name)          # the package with its real folder, its __init__.py not run
        pkg.__path__, pkg.__package__ = [str(path)], name
        sys.modules[name] = pkg
    megatron.bridge = sys.modules["megatron.bridge"]
    megatron.bridge.models = sys.modules["megatron.bridge.models"]
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.models.t5_provider import T5ModelProvider
    sys.modules["megatron.bridge.models"].GPTModelProvider = GPTModelProvider
    sys.modules["megatron.bridge.models"].T5ModelProvider = T5ModelProvider
    co = importlib.import_module("megatron.bridge.training.comm_overlap")
    from megatron.bridge.package_info import __version__
    had_te = co.HAVE_TE
    co.HAVE_TE = True
    return co, __version__, had_te


class _Recorder:
    """transformer_engine_torch as initialize_ub calls it; the communicators are records of their arguments."""

    class CommOverlapType(enum.Enum):
        RS = 0
        AG = 1

    @staticmethod
    def CommOverlapHelper(*groups):
        return "helper"

    @staticmethod
    def CommOverlapP2P(shape, buffer_dtype, helper, tp_size, comm_type, **kw):
        return {"class": "CommOverlapP2P", "shape": list(shape), "buffer_dtype": str(buffer_dtype),
                "tp_size": tp_size, "comm_type": comm_type.name, **kw}

    @staticmethod
    def CommOverlap(shape, buffer_dtype, helper, tp_size, **kw):
        kw["comm_type"] = kw["comm_type"].name
        return {"class": "CommOverlap", "shape": list(shape), "buffer_dtype": str(buffer_dtype),
                "tp_size": tp_size, **kw}

    @staticmethod
    def get_stream_priority_range():
        return 0, -5           # (least, greatest) on H100/H200; tptune.te.ubcfg.STREAM_PRIORITY_RANGE

    @staticmethod
    def device_supports_multicast():
        return True

    @staticmethod
    def ubuf_built_with_mpi():
        return False


_GLOBALS = {"_ub_communicators", "_ub_initialized", "_ub_with_cublasmp", "_MIN_STREAM_PRIORITY",
            "_MAX_STREAM_PRIORITY", "layers_atomic_ring_exchange"}
_TE_CODE = None


def te_initialize_ub(ub_cfgs, *, tp: int, fp8: bool, hidden: int, tokens: int) -> dict:
    """TE 2.20.2's initialize_ub as Bridge calls it (training/initialize.py, TE >= 2.7: one quantization mode),
    run afresh; returns {GEMM name: the communicator's recorded arguments}."""
    global _TE_CODE
    if _TE_CODE is None:
        tree = ast.parse(TE_BASE.read_text(), str(TE_BASE))
        keep = [n for n in tree.body
                if (isinstance(n, ast.FunctionDef) and n.name == "initialize_ub")
                or (isinstance(n, ast.ClassDef) and n.name == "UserBufferQuantizationMode")
                or (isinstance(n, ast.Assign) and {getattr(t, "id", None) for t in ast.walk(n.targets[0])} & _GLOBALS)]
        assert len(keep) == 2 + 5, [ast.dump(n)[:80] for n in keep]   # 5 assignments hold the 6 globals
        _TE_CODE = compile(ast.Module(body=keep, type_ignores=[]), str(TE_BASE), "exec")
    ns = {"os": os, "warnings": warnings, "torch": torch, "tex": _Recorder, "Enum": enum.Enum,
          "_NUM_MAX_UB_STREAMS": 3,   # TE 2.20.2 cpp_extensions/gemm.py
          **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Tuple",
                                                                        "Union")}}
    exec(_TE_CODE, ns)
    mode = ns["UserBufferQuantizationMode"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ns["initialize_ub"](shape=[tokens, hidden], tp_size=tp, quantization_modes=[mode.FP8 if fp8 else mode.NONE],
                            ub_cfgs=ub_cfgs, bootstrap_backend="gloo")
    return {name: comm for (name, _), comm in ns["_ub_communicators"].items()}


def _jsonable(v):
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return {"tuple" if isinstance(v, tuple) else "list": [_jsonable(x) for x in v]}
    return v


def run_config_round_trip(overlap) -> bool:
    """The CommOverlapConfig as Bridge writes it into a checkpoint's run_config.yaml (ConfigContainer.to_yaml:
    _convert_value_to_dict, yaml.safe_dump under safe_yaml_representers) and builds it again from it
    (ConfigContainer.from_dict: instantiate, strict): does the same config come back?"""
    import yaml
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase
    from megatron.bridge.utils.instantiate_utils import InstantiationMode, instantiate
    from megatron.bridge.utils.yaml_utils import safe_yaml_representers

    with safe_yaml_representers():
        text = yaml.safe_dump(_ConfigContainerBase._convert_value_to_dict(overlap), default_flow_style=False)
    back = instantiate(yaml.safe_load(text), mode=InstantiationMode.STRICT)
    was, now = overlap.tp_comm_overlap_cfg, back.tp_comm_overlap_cfg
    return (type(back) is type(overlap) and back.tp_comm_overlap is True
            and dataclasses.asdict(now) == dataclasses.asdict(was)
            and all(type(getattr(now, f.name)) is type(getattr(was, f.name)) for f in dataclasses.fields(was)))


def through_bridge(co, item: dict) -> dict:
    """One emitted module through Bridge: see the module doc."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    name = f"tuned_{item['id']}"
    spec = importlib.util.spec_from_file_location(name, item["module"])
    tuned = importlib.util.module_from_spec(spec)
    sys.modules[name] = tuned
    spec.loader.exec_module(tuned)
    classes = {c: getattr(tuned, c) is getattr(co, c) for c in
               ("TransformerLayerTPOverlapCfg", "RingExchangeOverlapCfg", "PipelineOverlapCfg", "BulkOverlapCfg")}
    gemms = {g: [f"{c.__module__}.{c.__qualname__}" for c in type(v).__mro__]
             for g, v in vars(tuned.tp_overlap_cfg).items() if v is not None}

    m = item["model"]
    model = co.GPTModelProvider(
        num_layers=2, hidden_size=m["hidden_size"], ffn_hidden_size=m["ffn_hidden_size"],
        num_attention_heads=m["num_attention_heads"], num_query_groups=m.get("num_query_groups"),
        kv_channels=m.get("kv_channels"), gated_linear_unit=bool(m.get("gated_mlp")), seq_length=item["seq_length"],
        vocab_size=m.get("vocab_size"), tensor_model_parallel_size=item["tp"], bf16=True,
        params_dtype=torch.bfloat16, **({"fp8": "hybrid", "fp8_recipe": item["fp8_recipe"]} if item["fp8"] else {}))
    fields = {f.name for f in dataclasses.fields(model)}
    not_fields = sorted(k for k in tuned.model_overrides if k not in fields)
    for k, v in tuned.model_overrides.items():
        setattr(model, k, v)
    overlap = co.CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=tuned.tp_overlap_cfg)
    overlap.finalize()
    overlap.data_parallel_size = 1            # ConfigContainer.set_data_parallel_size: TP N on N GPUs
    overlap.setup(model, OptimizerConfig(), DistributedDataParallelConfig())
    model.finalize()                          # MCore's TransformerConfig.__post_init__, as ConfigContainer.validate
    handed = model.tp_comm_overlap_cfg
    out = {"id": item["id"], "classes": classes, "gemms": gemms, "not_fields": not_fields,
           "model": {k: getattr(model, k) for k in (*tuned.model_overrides, "tp_comm_bootstrap_backend")},
           "handed": _jsonable(handed), "run_config_round_trip": run_config_round_trip(overlap)}
    del sys.modules[name]
    with open(item["ub_cfgs"]) as f:
        written = json.load(f)
    kw = {"tp": item["tp"], "fp8": item["fp8"], "hidden": m["hidden_size"],
          "tokens": item["seq_length"] * item["micro_batch_size"]}
    out["te_from_bridge"] = te_initialize_ub(handed, **kw)
    out["te_from_file"] = te_initialize_ub(written, **kw)
    if item.get("bare_bridge_classes"):
        # Control: the file's entries in Bridge's classes with only the file's knobs (Bridge's defaults for the
        # rest, as a user copying them by hand gets), and what TE reads from them and from the module's, as FP8
        cls = {"ring_exchange": co.RingExchangeOverlapCfg, "pipeline": co.PipelineOverlapCfg,
               "bulk": co.BulkOverlapCfg}
        entries = {f.name: None for f in dataclasses.fields(co.TransformerLayerTPOverlapCfg)}
        for g, e in written.items():
            c = cls[e["method"]]
            entries[g] = c(**{k: v for k, v in e.items() if k in {f.name for f in dataclasses.fields(c)}})
        bare = co.TransformerLayerTPOverlapCfg(**entries)
        plain = co.CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=bare)
        plain.finalize()
        plain.data_parallel_size = 1
        other = co.GPTModelProvider(num_layers=2, hidden_size=m["hidden_size"],
                                    num_attention_heads=m["num_attention_heads"],
                                    tensor_model_parallel_size=item["tp"], sequence_parallel=True)
        plain.setup(other, OptimizerConfig(), DistributedDataParallelConfig())
        fp8 = {**kw, "fp8": True}
        out["control_fp8"] = {"bare": te_initialize_ub(other.tp_comm_overlap_cfg, **fp8),
                              "module": te_initialize_ub(handed, **fp8), "file": te_initialize_ub(written, **fp8),
                              "bare_handed": _jsonable(other.tp_comm_overlap_cfg)}
    return out


def main() -> None:
    items = json.loads(Path(sys.argv[1]).read_text())
    co, version, had_te = bridge()
    import megatron.core
    torch.distributed.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/pg", rank=0, world_size=1)
    print("BRIDGE " + json.dumps({"version": version, "comm_overlap": co.__file__, "had_te": had_te,
                                  "megatron_core": megatron.core.__version__,
                                  "megatron_core_file": megatron.core.__file__, "te_base": str(TE_BASE)}), flush=True)
    for item in items:
        print("RESULT " + json.dumps(through_bridge(co, item)), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
