"""Files of Megatron's TP-overlap switches (te.megatron_flags decides them): Megatron-LM flags, the
TransformerConfig overrides, and a ``--tp-comm-overlap-cfg`` yaml of ub_cfgs that may lack a wgrad entry."""
from __future__ import annotations

from pathlib import Path

import yaml

from tptune.records.files import write_text_atomic
from tptune.te.megatron_flags import MEGATRON_CORE, NO_CLI_FLAG, megatron_flags, transformer_config_overrides

OVERRIDES_FILE = "transformer_config_overrides.yaml"   # written beside the flags


def write_megatron_flags(path: str | Path, switches: dict[str, bool], cfg_path: str | None = None,
                         overrides_file: str = OVERRIDES_FILE) -> Path:
    """A text file of Megatron-LM flags, one a line, with a header; switches without a CLI flag
    are named in comments (they need the TransformerConfig override file, ``overrides_file``)."""
    path = Path(path)
    lines = [f"# Megatron-LM flags for the TP overlap chosen by tptune ({MEGATRON_CORE})"]
    lines += megatron_flags(switches, cfg_path) or ["# no TP communication overlap: plain NCCL everywhere"]
    for name in NO_CLI_FLAG:
        if switches[name]:
            lines.append(f"# {name}: true has no command-line flag in Megatron-LM; set it through the "
                         f"TransformerConfig override ({overrides_file})")
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def write_transformer_config_yaml(path: str | Path, switches: dict[str, bool]) -> Path:
    path = Path(path)
    body = yaml.safe_dump(transformer_config_overrides(switches), sort_keys=False)
    write_text_atomic(path, f"# TransformerConfig overrides for TP overlap ({MEGATRON_CORE})\n{body}")
    return path


def write_overlap_yaml(path: str | Path, cfgs: dict) -> Path:
    """``--tp-comm-overlap-cfg`` file for ub_cfgs that may lack a wgrad entry (reduce-scatter dgrad)."""
    path = Path(path)
    lines = [f"{k}: " + yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip() for k, v in cfgs.items()]
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
