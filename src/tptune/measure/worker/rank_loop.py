"""What every rank of a warm worker group does (worker.server starts it): join the group's process
groups, then take case after case until told to exit or idle for too long.

One request's stages: rank 0 accepts it (and tells the client its case started), every rank receives
it by broadcast, runs the case (worker.harness) and sends its result to rank 0, which answers. A rank
whose case fails reports it in error.rank<R>.json and exits (server's docstring says why).
"""
from __future__ import annotations

import gc
import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from tptune.cases import parse_case_id
from tptune.measure.envinfo import collect
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.harness import run_case
from tptune.measure.worker.lifeline import Busy, watch_client
from tptune.measure.worker.wire import recv_json, send_json
from tptune.model.spec import parse_model

EXIT = {"cmd": "exit"}


def serve(socket_path: str, idle_timeout: float, device: str, *, t_start: float, import_s: float) -> int:
    ctx = _join_group(device)
    env = collect(device) if ctx.rank == 0 else None
    startup = {"import_s": import_s, "ready_s": time.time() - t_start}
    srv = _listen(Path(socket_path), idle_timeout) if ctx.rank == 0 else None
    busy = Busy(socket_path) if ctx.rank == 0 else None
    served = 0
    while True:
        conn, msg, watched = _accept(srv, busy) if ctx.rank == 0 else (None, None, None)
        box = [msg]
        dist.broadcast_object_list(box, src=0, group=ctx.cpu_group)
        msg = box[0]
        if msg.get("cmd") == "exit":
            if conn:
                conn.close()
            break
        result = _run_request(msg, ctx)
        results = [None] * ctx.world_size if ctx.rank == 0 else None
        dist.gather_object(result, results, dst=0, group=ctx.cpu_group)
        if ctx.rank == 0:
            reply = {"ranks": results, "environment": env, "startup": startup if served == 0 else None,
                     "served_before": served, "server_pid": os.getpid()}
            watched.set()
            busy.__exit__()   # before the answer: a client that has it may find this group free at once
            send_json(conn, reply)
            conn.close()
        served += 1
    if srv:
        srv.close()
        Path(socket_path).unlink(missing_ok=True)
    dist.destroy_process_group()
    return 0


def _join_group(device_kind: str) -> RankContext:
    """The rank's process group (NCCL on GPUs, gloo on CPU) and a gloo group for control messages, its
    device's context created, every rank started."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device_kind == "cuda":
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
    gc.collect()
    gc.freeze()
    return ctx


def _listen(path: Path, idle_timeout: float) -> socket.socket:
    """Rank 0's socket, which appears only once listening is possible."""
    path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)
    srv.listen(1)
    srv.settimeout(idle_timeout)
    return srv


def _accept(srv: socket.socket, busy: Busy):
    """Rank 0: the next request (exit when idle for too long or the client sent nothing), the connection
    it came on and, for a case, the watch on its client; the group is busy and the client told its case
    started."""
    conn, watched = None, None
    try:
        conn, _ = srv.accept()
        conn.settimeout(None)
        msg = recv_json(conn) or EXIT
    except (socket.timeout, TimeoutError):
        msg = EXIT
    if msg.get("cmd") != "exit":
        busy.__enter__()
        send_json(conn, {"accepted": msg.get("case")})   # the client knows its case started
        watched = watch_client(conn)
    return conn, msg, watched


def _run_request(msg: dict, ctx: RankContext) -> dict:
    """This rank's result of the request's case; on any failure its report is written and the rank exits
    (the group ends with it)."""
    case = parse_case_id(msg["case"])
    out_dir = Path(msg["out_dir"])
    t_req = time.perf_counter()
    try:
        mc = parse_model(msg["model"]["model"] | {"workload": msg["model"]["workload"]}, msg["model"]["source"])
        _fault(msg["settings"].get("fault"), ctx.rank)
        result = run_case(case, mc, ctx, msg["settings"], out_dir)
        result["serve_s"] = time.perf_counter() - t_req   # request in -> result ready, close included
        return result
    except BaseException as exc:  # noqa: BLE001 - any failure ends this group; report it first
        _report_and_exit(exc, ctx.rank, out_dir)


def _report_and_exit(exc: BaseException, rank: int, out_dir: Path) -> NoReturn:
    """error.rank<R>.json (called while ``exc`` is handled: its traceback is the one recorded), then exit."""
    out_dir.mkdir(parents=True, exist_ok=True)
    err = out_dir / f"error.rank{rank}.json"
    err.with_suffix(".tmp").write_text(json.dumps({  # atomic: the client may read it any moment
        "rank": rank, "type": type(exc).__name__, "message": str(exc)[:4000],
        "traceback": traceback.format_exc()[-8000:],
    }))
    os.replace(err.with_suffix(".tmp"), err)
    sys.stderr.flush()
    os._exit(1)


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
