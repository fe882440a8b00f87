"""Whether this machine can run the confirm stage at all: Megatron-LM's training package and TP GPUs. With the
stage on by default for the te backend, a node that lacks either gets a confirm.json saying why (the workflow's
rule) instead of launches that each fail the same way."""
from __future__ import annotations

import importlib.util

from tptune.errors import TptuneError


class ConfirmUnavailable(TptuneError):
    """The confirm stage cannot run here; the message says what is missing."""


def megatron_training_missing() -> str | None:
    try:
        found = importlib.util.find_spec("megatron.training") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else ("megatron.training does not import here: the megatron-core wheel (0.19 and later) "
                               "carries it (pip install megatron-core; docs/confirm.md)")


def gpus_missing(tp: int) -> str | None:
    try:
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:       # a broken CUDA set-up reads as no GPUs, with its reason
        return f"no CUDA GPU here ({type(exc).__name__}: {exc}); TP {tp} needs {tp}"
    return None if n >= tp else f"{n} CUDA GPU{'s' if n != 1 else ''} here; TP {tp} needs {tp}"


def check(tp: int, *, own_launcher: bool) -> None:
    """ConfirmUnavailable when the launches cannot run on this machine. A site's own launcher (``--launcher``)
    may start them elsewhere: then nothing is checked here."""
    if own_launcher:
        return
    why = [w for w in (megatron_training_missing(), gpus_missing(tp)) if w]
    if why:
        raise ConfirmUnavailable("the confirm stage cannot run on this machine: " + "; ".join(why))


def not_run_record(tp: int | None, why: str) -> dict:
    """confirm.json for a stage that could not run: the report says so, nothing is compared."""
    return {"not_run": why, "tp": tp}
