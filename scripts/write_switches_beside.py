"""Write the Megatron switches that run each given tp_comm_overlap_cfg*.yaml as written, beside it
(megatron_flags<sfx>.txt, transformer_config_overrides<sfx>.yaml), for run folders kept without sessions
that `tptune rederive` cannot rewrite (results/legacy, the small-files stability runs). Refuses a file
Megatron's switches cannot express or `tptune check` does not pass.

    python scripts/write_switches_beside.py results/stability-llama3-70b-x2-v4/rep1/tp_comm_overlap_cfg.tp2.yaml ...
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tptune.decide.file_sets import names
from tptune.emit.megatron_switches import write_megatron_flags, write_transformer_config_yaml
from tptune.te import megatron_flags as mf
from tptune.te.check import check_pair


def main(paths: list[str]) -> int:
    for p in map(Path, paths):
        ub = yaml.safe_load(p.read_text())
        sfx = p.name[len("tp_comm_overlap_cfg."):-len(".yaml")]   # "tp<N>", or "" for the plain names
        files = names("te", int(sfx[2:]) if sfx else None)
        sw = mf.block_switches(ub)
        res = check_pair(ub, sw, fp8="fp8" in str(p))
        if not res.ok:
            print(f"{p}: not run as written under any switches tptune derives: {[x.line() for x in res.problems]}")
            return 1
        write_megatron_flags(p.parent / files["megatron_flags"], sw, p.name, overrides_file=files["overrides"])
        write_transformer_config_yaml(p.parent / files["overrides"], sw)
        print(f"{p}: switches written beside it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
