"""The workflow's stages that decide and then write: each computes its values in trace/ or decide/ and
hands them to emit/ (the rules reach them through cli.main; cli.rederive runs them again)."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import polars as pl

from tptune.cases import Case
from tptune.decide.answer import decide
from tptune.decide.file_sets import ALL_FILES, FileSet
from tptune.decide.layer import layer_members
from tptune.emit.configs import write_decisions_json
from tptune.emit.file_sets import remove_sets, write_te_set, write_torch_set
from tptune.emit.presets import write_preset
from tptune.emit.tables import write_table
from tptune.records.run_dir import RunDir
from tptune.trace.session_tables import case_table, measurement_table, session_table


def analyze_case(run_json: Path, out: Path) -> pl.DataFrame:
    """One case's trace metrics to ``out`` (Parquet)."""
    df = case_table(run_json)
    write_table(df, out)
    return df


def analyze_session(session: Path, out: Path) -> pl.DataFrame:
    """Every member's trace metrics of one session to ``out`` (the run's analysis/, RunDir.session_analysis)."""
    df = session_table(session)
    write_table(df, out)
    return df


def collect(run: RunDir, session_jsons: list[Path], out: Path) -> pl.DataFrame:
    """The run's measurement table (one row per setting per session) to ``out`` and its CSV beside it."""
    df = measurement_table(run, session_jsons)
    write_table(df, out, csv=True)
    return df


def block_members(s, tp: int, points_by_op: dict[str, dict], run: RunDir) -> tuple[list[Case], Case]:
    """The block session's settings and the tuned one among them; writes the presets they name (te) to
    the run's presets/."""
    members, tuned, presets = layer_members(s, tp, points_by_op)
    if presets:
        run.presets.mkdir(parents=True, exist_ok=True)
    for p in presets:
        write_preset(run.presets, p.name, p.ub_cfgs, p.header)
    return members, tuned


def write_file_sets(run: RunDir, sets: Iterable[FileSet]) -> None:
    """Every set file of an earlier decision removed, then ``sets`` written, each under each of its names."""
    remove_sets(run, ALL_FILES.values())
    for fs in sets:
        for files in fs.names:
            if fs.shape_map is not None:
                write_torch_set(run, files, fs.shape_map, fs.notes)
            else:
                write_te_set(run, files, fs.ub, fs.switches, model=fs.model, workload=fs.workload, fp8=fs.fp8,
                             notes=list(fs.notes), set_tp=fs.tp)


def answer(s, run: RunDir, final_files: list[Path]) -> dict[str, dict]:
    """The run's answer (decide.answer) written: the file set of each TP, then decisions.json; returns
    decisions.json's records by op."""
    ans = decide(s, run, final_files)
    write_file_sets(run, ans.file_sets.sets)
    write_decisions_json(run.decisions_json, ans.records.values(), ans.meta)
    return ans.records
