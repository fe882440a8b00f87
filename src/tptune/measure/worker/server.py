"""A warm TP worker group: started once under torch.distributed.run, then evaluates cases on request.

Start-up (imports, process group, NCCL) costs seconds to tens of seconds; one case costs well under
a second of GPU time. So a group stays up and takes case after case over a Unix socket until it has
been idle for --idle-timeout seconds. Rank 0 accepts a request and broadcasts it to the other ranks;
every rank runs the case and rank 0 answers with all ranks' results (worker.rank_loop).

A rank that fails writes error.rank<R>.json into the case folder and exits at once: a rank stuck in a
collective cannot be unwound safely, so torch.distributed.run tears the group down and the client
reports the failure and starts a fresh group for the next case.

This module is the rank's entry point: it ties the rank's life to its parent's before anything slow
happens, imports the backend's libraries where asked, then runs the loop. Its imports are the
standard library's only, so that start-up's import time (``import_s``) counts what the loop needs.
"""
from __future__ import annotations

import argparse
import sys
import time

from tptune.measure.worker.lifeline import die_with_parent

_T_START = time.time()


def _parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--idle-timeout", type=float, default=60.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--preload", choices=["te"], help="import the backend's libraries at start-up")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    die_with_parent()
    if args.preload == "te":  # ~8 s of imports: part of start-up, not of the first case's init
        import megatron.core  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    from tptune.measure.worker.rank_loop import serve   # torch, the harness and the backends

    return serve(args.socket, args.idle_timeout, args.device, t_start=_T_START, import_s=time.time() - _T_START)


if __name__ == "__main__":
    sys.exit(main())
