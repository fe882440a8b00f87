"""The files users load, one coherent set per TP (decide.file_sets decides them): a te set is the ub_cfgs
yaml and json, the Megatron-LM flags, the TransformerConfig overrides and the Bridge/NeMo module, written
together; a torch set is the chunk map. Files of an earlier decision are removed first."""
from __future__ import annotations

from collections.abc import Iterable

from tptune.emit.configs import (write_bridge_overlap_py, write_chunked_cfg, write_tp_comm_overlap_cfg,
                                 write_ub_cfgs_json)
from tptune.emit.megatron_switches import write_megatron_flags, write_transformer_config_yaml
from tptune.records.run_dir import RunDir


def remove_sets(run: RunDir, patterns: Iterable[str]) -> None:
    """Remove every set file of the run: each name pattern ("tp_comm_overlap_cfg{}.yaml") plain and per TP."""
    found = []
    for pat in patterns:
        found += [run.file(pat.format(""))] + run.files(pat.format(".tp*"))
    for p in found:
        if p.exists():
            p.unlink()


def write_te_set(run: RunDir, files: dict[str, str], ub: dict, switches: dict, *, model: str, workload: dict,
                 fp8: bool, notes: list[str], set_tp: int) -> None:
    """The te set of TP ``set_tp`` under the names ``files`` ({role: name})."""
    notes = notes + [f"Load together with {files['megatron_flags']} (Megatron-LM) or {files['overrides']} "
                     f"(Megatron-core): the switches this file needs; with other switches TE may not run it as written"]
    write_tp_comm_overlap_cfg(run.file(files["ub_cfgs_yaml"]), ub, model=model, workload=workload, tp=set_tp,
                              notes=notes, fp8=fp8)
    write_ub_cfgs_json(run.file(files["ub_cfgs_json"]), ub, fp8=fp8)
    write_megatron_flags(run.file(files["megatron_flags"]), switches, files["ub_cfgs_yaml"],
                         overrides_file=files["overrides"])
    write_transformer_config_yaml(run.file(files["overrides"]), switches)
    write_bridge_overlap_py(run.file(files["bridge"]), ub, switches, model=model, workload=workload, fp8=fp8,
                            notes=[f"TP {set_tp}"])


def write_torch_set(run: RunDir, files: dict[str, str], shape_map: dict, notes: Iterable[str]) -> None:
    """The torch set (the chunk map) under the names ``files``."""
    write_chunked_cfg(run.file(files["chunked_cfg"]), shape_map, notes)
