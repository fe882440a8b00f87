"""Megatron-LM's training log, read: the per-iteration line of ``training_log`` and the errors a failed launch
printed.

The line (megatron/training/training.py, training_log, megatron-core 0.19.2), printed by the last rank at every
``--log-interval``::

     [2026-11-27 10:01:02.123456] iteration       12/      30 | consumed samples:           48 | elapsed time
     per iteration (ms): 512.3 | learning rate: 1.000000E-04 | global batch size:     4 | lm loss: 1.176834E+01 |
     loss scale: 1.0 | grad norm: 3.214 | number of skipped iterations:   0 | number of nan iterations:   0 |

(one line). Fields between the iteration and the loss vary with the options (throughput, energy, skipped
samples); each is found by its own label. ``lm loss`` has 7 significant digits (``{:.6E}``), ``grad norm`` 3
decimals, the time 0.1 ms.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass

_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
_LOSS = re.compile(r"\blm loss:\s*([-+0-9.Ee]+)")
_GRAD = re.compile(r"\bgrad norm:\s*([-+0-9.Ee]+|nan|inf)")
_SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
_NAN = re.compile(r"number of nan iterations:\s*(\d+)")

# What a failed launch is, by the first matching line (checked in this order), and the lines worth showing.
FAILURE_KINDS = (
    ("oom", re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)),
    ("userbuffers", re.compile(r"userbuffer|comm_gemm_overlap|initialize_ub|\bub_(?:cfg|comm|overlap)|UB_", re.I)),
    ("nccl", re.compile(r"NCCL (?:error|WARN)|ncclInternalError|ncclSystemError|ProcessGroupNCCL.*(?:error|timeout)",
                        re.I)),
)
_ERROR_LINE = re.compile(r"Error|error:|Traceback|Assertion|assert|FAILED|Exception|out of memory|Killed|"
                         r"Segmentation fault|core dumped|NVTE_CHECK", re.I)


@dataclass(frozen=True)
class Iteration:
    iteration: int
    of: int
    ms: float
    loss: float | None
    grad_norm: float | None
    skipped: int | None
    nan: int | None


def parse_iterations(text: str) -> list[Iteration]:
    """Every training-log line in ``text``, in order (a line without the time is no training-log line)."""
    out = []
    for line in text.splitlines():
        it, ms = _ITER.search(line), _MS.search(line)
        if not it or not ms:
            continue
        loss, grad = _LOSS.search(line), _GRAD.search(line)
        skipped, nan = _SKIPPED.search(line), _NAN.search(line)
        out.append(Iteration(int(it.group(1)), int(it.group(2)), float(ms.group(1)),
                             float(loss.group(1)) if loss else None, float(grad.group(1)) if grad else None,
                             int(skipped.group(1)) if skipped else None, int(nan.group(1)) if nan else None))
    return out


def median_ms(iterations: list[Iteration], first: int) -> float | None:
    """The median time per iteration over iterations ``first`` and after (the earlier ones warm up)."""
    ms = [i.ms for i in iterations if i.iteration >= first]
    return statistics.median(ms) if ms else None


def error_lines(text: str, limit: int = 12) -> list[str]:
    """The first distinct lines that read as an error (every rank prints its own copy: each once)."""
    out: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        s = re.sub(r"^\[(?:rank|default)?\d+\]:?\s*", "", s)     # torchrun's per-rank prefix
        if s and _ERROR_LINE.search(s) and s not in out:
            out.append(s[:400])
            if len(out) >= limit:
                break
    return out


def failure_kind(text: str) -> str | None:
    """"oom", "userbuffers" or "nccl" when a line of ``text`` says so, else None."""
    for kind, pattern in FAILURE_KINDS:
        if any(pattern.search(line) and _ERROR_LINE.search(line) for line in text.splitlines()):
            return kind
    return None


def as_dicts(iterations: list[Iteration]) -> list[dict]:
    return [asdict(i) for i in iterations]
