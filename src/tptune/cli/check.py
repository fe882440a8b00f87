"""tptune check FILE [--overrides transformer_config_overrides.yaml | --flags megatron_flags.txt] [--fp8] [--json]

Exit 0 when Megatron-core and Transformer Engine run the ub_cfgs FILE (a --tp-comm-overlap-cfg YAML or
a ub_cfgs JSON) with those switches as written; with neither option, with Megatron's defaults for a user
who passes --sequence-parallel --tp-comm-overlap --tp-comm-overlap-cfg FILE. Otherwise exit 1 and name,
for each conflict, the GEMM entry, the switches and what TE does instead (tptune.te.check). Exit 2 when
a file cannot be read or names something Megatron or TE does not have.
"""
from __future__ import annotations

import json
from pathlib import Path

from tptune.errors import ConfigError
from tptune.te import check


def add_check_parser(sub) -> None:
    p = sub.add_parser("check", help="exit 1 unless Megatron-core and TE run a --tp-comm-overlap-cfg file with "
                                     "these switches as written (Megatron's defaults when none are given)")
    p.add_argument("file", help="a --tp-comm-overlap-cfg YAML or ub_cfgs JSON (tptune's, NVIDIA's, anyone's)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--overrides", help="a TransformerConfig overrides YAML (transformer_config_overrides.yaml)")
    g.add_argument("--flags", help="a file of Megatron-LM flags (megatron_flags.txt, or a launch script's)")
    p.add_argument("--fp8", action="store_true", help="the run trains in FP8 (Megatron-LM --fp8-format)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_check)


def cmd_check(a) -> int:
    read = check.read_ub_cfgs(a.file)
    cfgs, notes = read.cfgs, list(read.notes)
    what = f"the ub_cfgs {a.file} resolves to" if read.notes else a.file
    if a.overrides:
        switches, source = check.switches_from_overrides(a.overrides), f"the switches of {a.overrides}"
    elif a.flags:
        switches, cfg = check.read_flags(a.flags)
        source = f"the flags of {a.flags}"
        if switches.get("tp_comm_overlap") and "sequence_parallel" not in switches:
            notes.append(f"{a.flags} has --tp-comm-overlap but not --sequence-parallel: Megatron-LM asserts it "
                         f"(training/arguments.py validate_args); judged as if it were on the same command line")
        if cfg and Path(cfg).name != Path(a.file).name:
            notes.append(f"{a.flags} names --tp-comm-overlap-cfg {cfg}: Megatron-LM loads that file, not {a.file}; "
                         f"this check judged {a.file}")
    else:
        switches, source = None, f"{check.MEGATRON_DEFAULTS} --tp-comm-overlap-cfg {a.file}"
    try:
        res = check.check_pair(cfgs, switches, fp8=a.fp8)
    except ValueError as exc:
        raise ConfigError(a.file, [str(exc)]) from None
    res.notes[:0] = notes
    if a.json:
        print(json.dumps({"file": a.file, "switches_from": source, "fp8": a.fp8, **res.to_dict()}, indent=1))
    elif res.ok:
        print(f"ok: Megatron-core and TE run {what} with {source} as written")
    else:
        print(f"{what} with {source}: {len(res.problems)} conflict(s); Megatron-core and TE do not run it as written")
        for p in res.problems:
            print(f"  {p.line()}")
    if not a.json:
        for n in res.notes:
            print(f"  note: {n}")
    return 0 if res.ok else 1
