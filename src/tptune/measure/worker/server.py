"""A warm TP worker group: started once under torch.distributed.run, then evaluates cases on request.

Start-up (imports, process group, NCCL) costs seconds to tens of seconds; one case costs well under
a second of GPU time. So a group stays up and takes case after case over a Unix socket until it has
been idle for --idle-timeout seconds. Rank 0 accepts a request and broadcasts it to the other ranks;
every rank runs the case and rank 0 answers with all ranks' results.

A rank that fails writes error.rank<R>.json into the case folder and exits at once: a rank stuck in a
collective cannot be unwound safely, so torch.distributed.run tears the group down and the client
reports the failure and starts a fresh group for the next case.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

_T_START = time.time()


def _fault(spec: str | None, rank: int) -> None:
    """Failure injection for testing the failure paths: "raise:<rank>", "hang:<rank>", "exit:<rank>"
    ("corrupt_dgrad:<rank>" is planted in the torch backend's layers instead: torch_backend)."""
    if not spec:
        return
    what, _, who = spec.partition(":")
    if who and int(who) != rank:
        return
    if what == "raise":
        raise RuntimeError(f"injected failure on rank {rank}")
    if what == "hang":
        time.sleep(10**6)
    if what == "exit":
        os._exit(17)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--idle-timeout", type=float, default=60.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--preload", choices=["te"], help="import the backend's libraries at start-up")
    args = ap.parse_args(argv)
    from tptune.measure.worker.lifeline import Busy, die_with_parent, watch_client
    die_with_parent()
    if args.preload == "te":  # ~8 s of imports: part of start-up, not of the first case's init
        import megatron.core  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401

    import torch
    import torch.distributed as dist

    from tptune.cases import parse_case_id
    from tptune.measure.envinfo import collect
    from tptune.model.spec import parse_model
    from tptune.measure.worker.context import RankContext
    from tptune.measure.worker.harness import run_case
    from tptune.measure.worker.wire import recv_json, send_json

    t_import = time.time() - _T_START
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(days=1))
    ctx = RankContext(rank, world, local_rank, device, dist.group.WORLD, cpu_group)
    torch.ones(1, device=device)  # create the context now, not inside the first case
    dist.barrier(group=cpu_group)
    # Every case ends with a gc.collect() (TE's userbuffers must be freed before the next case builds
    # its own); with torch, TE and Megatron loaded a full collection walks ~10^6 objects (~0.1-0.2 s a
    # case). What start-up created lives as long as the group: freeze it, so a collection only walks
    # what the cases created.
    import gc
    gc.collect()
    gc.freeze()
    env = collect(args.device) if rank == 0 else None
    startup = {"import_s": t_import, "ready_s": time.time() - _T_START}

    srv = None
    if rank == 0:
        path = Path(args.socket)
        path.unlink(missing_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)  # appears only once listening is possible
        srv.listen(1)
        srv.settimeout(args.idle_timeout)
    served = 0
    busy = Busy(args.socket) if rank == 0 else None
    while True:
        conn, msg, watched = None, None, None
        if rank == 0:
            try:
                conn, _ = srv.accept()
                conn.settimeout(None)
                msg = recv_json(conn) or {"cmd": "exit"}
            except (socket.timeout, TimeoutError):
                msg = {"cmd": "exit"}
            if msg.get("cmd") != "exit":
                busy.__enter__()
                send_json(conn, {"accepted": msg.get("case")})   # the client knows its case started
                watched = watch_client(conn)
        box = [msg]
        dist.broadcast_object_list(box, src=0, group=cpu_group)
        msg = box[0]
        if msg.get("cmd") == "exit":
            if conn:
                conn.close()
            break
        case = parse_case_id(msg["case"])
        out_dir = Path(msg["out_dir"])
        t_req = time.perf_counter()
        try:
            mc = parse_model(msg["model"]["model"] | {"workload": msg["model"]["workload"]}, msg["model"]["source"])
            _fault(msg["settings"].get("fault"), rank)
            result = run_case(case, mc, ctx, msg["settings"], out_dir)
            result["serve_s"] = time.perf_counter() - t_req   # request in -> result ready, close included
        except BaseException as exc:  # noqa: BLE001 - any failure ends this group; report it first
            out_dir.mkdir(parents=True, exist_ok=True)
            err = out_dir / f"error.rank{rank}.json"
            err.with_suffix(".tmp").write_text(json.dumps({  # atomic: the client may read it any moment
                "rank": rank, "type": type(exc).__name__, "message": str(exc)[:4000],
                "traceback": traceback.format_exc()[-8000:],
            }))
            os.replace(err.with_suffix(".tmp"), err)
            sys.stderr.flush()
            os._exit(1)
        results = [None] * world if rank == 0 else None
        dist.gather_object(result, results, dst=0, group=cpu_group)
        if rank == 0:
            reply = {"ranks": results, "environment": env, "startup": startup if served == 0 else None,
                     "served_before": served, "server_pid": os.getpid()}
            watched.set()
            busy.__exit__()   # before the answer: a client that has it may find this group free at once
            send_json(conn, reply)
            conn.close()
        served += 1
    if srv:
        srv.close()
        Path(args.socket).unlink(missing_ok=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
