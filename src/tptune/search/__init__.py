"""The tuner's decisions: noise-aware comparison, stepwise bisection, TP choice, candidate
settings, TE ub_cfgs, and the writers of what was decided. Pure functions over measured points."""
from .bisect import next_points, result
from .emit import (chunked_shape_map, decisions_record, te_ub_cfgs, write_chunked_cfg,
                   write_decisions_json, write_tp_comm_overlap_cfg, write_ub_cfgs_json)
from .methods import DEFAULT_CONFIG, GemmPlan, chunk_candidates, te_candidates
from .noise import Comparison, cheaper, compare, compare_points, cost_key, margin, relative_se
from .points import make_point, point_case, point_median, point_ok, point_samples, point_stats
from .tp_decision import TpPoints, hides_communication, tp_next, tp_result
from .ubcfg import (allowed_methods, case_ub_cfgs, compose_ub_cfgs, load_preset, merge_entry,
                    te_default_ub_cfgs, validate_ub_cfgs)

__all__ = [
    "next_points", "result",
    "chunked_shape_map", "decisions_record", "te_ub_cfgs", "write_chunked_cfg",
    "write_decisions_json", "write_tp_comm_overlap_cfg", "write_ub_cfgs_json",
    "DEFAULT_CONFIG", "GemmPlan", "chunk_candidates", "te_candidates",
    "Comparison", "cheaper", "compare", "compare_points", "cost_key", "margin", "relative_se",
    "make_point", "point_case", "point_median", "point_ok", "point_samples", "point_stats",
    "TpPoints", "hides_communication", "tp_next", "tp_result",
    "allowed_methods", "case_ub_cfgs", "compose_ub_cfgs", "load_preset", "merge_entry",
    "te_default_ub_cfgs", "validate_ub_cfgs",
]
