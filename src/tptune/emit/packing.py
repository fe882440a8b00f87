"""packing.json and each framework's settings at the chosen capacity T (issue 53, docs/packing.md), written from
values (decide.packing's record, packing.emit's FrameworkSettings) into the run folder:

    packing.json                   the decision, per-T figures with their intervals, padding, memory, the fit
    packing/megatron_lm.txt        Megatron-LM's arguments, one flag (with its value) a line, as megatron_flags.txt
    packing/megatron_rl.txt        Megatron-RL's
    packing/slime.txt              slime's
    packing/verl.yaml              veRL's Megatron-engine config overrides, nested (a Hydra config to merge); the
                                   command-line form and what veRL lacks to hold T in its header
    packing/tp_comm_overlap_cfg.yaml   the set's userbuffers file the flags above name (te runs), a copy of the
                                   TP's tp_comm_overlap_cfg.tp<N>.yaml, so the folder loads as it is

A decision without a capacity removes the framework files an earlier decision wrote.
"""
from __future__ import annotations

import yaml

from tptune.emit.records import write_record
from tptune.packing.emit import FrameworkSettings
from tptune.records.files import write_text_atomic
from tptune.records.run_dir import RunDir

FILES = {"megatron_lm": "megatron_lm.txt", "megatron_rl": "megatron_rl.txt", "slime": "slime.txt",
         "verl": "verl.yaml"}
CFG_NAME = "tp_comm_overlap_cfg.yaml"
TITLES = {"megatron_lm": "Megatron-LM (packed data, e.g. SFT packing)", "megatron_rl": "Megatron-RL",
          "slime": "slime", "verl": "veRL (Megatron engine)"}


def arg_lines(args: tuple[str, ...] | list[str]) -> list[str]:
    """One flag a line, with its value where it takes one (the next token not a flag)."""
    out: list[str] = []
    for a in args:
        if out and not a.startswith("--"):
            out[-1] += f" {a}"
        else:
            out.append(a)
    return out


def _nested(overrides: dict) -> dict:
    out: dict = {}
    for key, v in overrides.items():
        d = out
        *head, last = key.split(".")
        for k in head:
            d = d.setdefault(k, {})
        d[last] = v
    return out


def framework_text(fs: FrameworkSettings, header: list[str]) -> str:
    """The file users load for ``fs``: comments (``header``, whether the framework can hold T as it is), then
    the arguments one a line, or veRL's overrides as nested YAML."""
    head = [f"# {TITLES[fs.framework]}: packed micro-batches of exactly T = {fs.capacity} tokens with the tuned "
            "TP overlap (tptune, packing.json)", *(f"# {h}" for h in header)]
    if fs.ready:
        head.append("# Ready as it is: these settings hold every micro-batch at T.")
    else:
        head.append("# NOT READY: these settings are not enough; the framework cannot hold a fixed token count "
                    "today. It takes:")
        head += [f"#  - {n}" for n in fs.needs]
    if fs.framework == "verl":
        head.append(f"# As command-line overrides: {fs.command_line()}")
        return "\n".join(head) + "\n" + yaml.safe_dump(_nested(fs.overrides), sort_keys=False)
    return "\n".join(head + arg_lines(fs.args)) + "\n"


def write_packing(run: RunDir, record: dict, frameworks: list[FrameworkSettings], header: list[str],
                  cfg_text: str | None) -> dict[str, str]:
    """The framework files (module doc) and packing.json (``record`` with ``files`` added); returns the files
    written, by framework, relative to the run folder."""
    files: dict[str, str] = {}
    folder = run.packing_dir
    for name in [*FILES.values(), CFG_NAME]:
        (folder / name).unlink(missing_ok=True)
    for fs in frameworks:
        path = folder / FILES[fs.framework]
        write_text_atomic(path, framework_text(fs, header))
        files[fs.framework] = str(path.relative_to(run.root))
    if frameworks and cfg_text is not None:
        write_text_atomic(folder / CFG_NAME, cfg_text)
        files["tp_comm_overlap_cfg"] = str((folder / CFG_NAME).relative_to(run.root))
    write_record(run.packing_json, {**record, "files": files})
    return files

