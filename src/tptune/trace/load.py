"""Load a Kineto (PyTorch profiler) Chrome trace into lean polars frames.

Memory is the constraint: a several-hundred-MB trace decoded whole into Python
objects needs several times its size. So the ``traceEvents`` array is decoded in
chunks (msgspec with a typed Struct that keeps only the fields we use), each
chunk is turned into columns right away and its Python objects dropped.

Chunk boundaries are found at ``},<newline>{``: a raw newline cannot occur
inside a JSON string, so that sequence is always between two array elements in
Kineto's pretty-printed output. A file without such boundaries (compact JSON)
simply decodes as one chunk.
"""

from __future__ import annotations

import gzip
import io
import multiprocessing
import os
import re
import zlib
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import msgspec
import orjson
import polars as pl

from tptune.errors import TraceError

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "user_annotation", "python_function")

_READ_BLOCK = 8 << 20
# Big traces are decoded by a few worker processes (decoding is CPU-bound and
# holds the GIL); small ones in process, where starting workers would cost more.
_PARALLEL_MIN_BYTES = 96 << 20
_MAX_WORKERS = 2
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,[ \t\r]*\n\s*\{")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


# gc=False: millions of short-lived structs would otherwise trigger GC passes.
class _Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    stream: int | None = None


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    # pid/tid are strings for Kineto's own "Spans"/"Traces" rows.
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


# Fast path: a union tagged on "ph", where only complete events ("X") keep
# fields; flows, instants, metadata decode to empty structs. A chunk with an
# unexpected "ph" falls back to the plain decoder.
class _Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


_OTHER_PHASES = [
    msgspec.defstruct(f"_Phase{ord(p)}", [], gc=False, tag_field="ph", tag=p) for p in "BEiIsCbnetfPONDMRc"
]
_decode_tagged = msgspec.json.Decoder(list[Union[(_Complete, *_OTHER_PHASES)]]).decode
_decode_plain = msgspec.json.Decoder(list[_Event]).decode


def _decode_events(data: bytes) -> list:
    try:
        return [e for e in _decode_tagged(data) if type(e) is _Complete]
    except msgspec.ValidationError:
        return [e for e in _decode_plain(data) if e.ph == "X"]

FRAME_SCHEMA = {
    "ts": pl.Int64,  # ns, exact (Kineto ts/dur are µs with 3 decimals)
    "dur": pl.Int64,
    "name": pl.Categorical,
    "cat": pl.Categorical,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
}


@dataclass
class LoadedTrace:
    """One rank's trace. ``gpu``: kernels/memcpy/memset; ``runtime``: CUDA
    runtime/driver calls (launches); ``cpu``: CPU ops and record_function ranges.
    All frames have the columns of FRAME_SCHEMA, times in integer ns."""

    path: str
    rank: int | None
    gpu: pl.DataFrame
    runtime: pl.DataFrame
    cpu: pl.DataFrame
    meta: dict = field(default_factory=dict)

    @property
    def cpu_only(self) -> bool:
        return self.gpu.height == 0


def _to_ns(values: list[float]) -> pl.Series:
    return (pl.Series(values, dtype=pl.Float64) * 1000.0).round(0).cast(pl.Int64)


def _chunk_frame(events: list[_Event]) -> pl.DataFrame:
    keep = [e for e in events if e.cat != "Trace"]
    no_args = _Args()
    args = [e.args or no_args for e in keep]
    df = pl.DataFrame(
        {
            "ts": _to_ns([e.ts for e in keep]),
            "dur": _to_ns([e.dur for e in keep]),
            "name": pl.Series([e.name for e in keep], dtype=pl.Categorical),
            "cat": pl.Series([e.cat for e in keep], dtype=pl.Categorical),
            "pid": pl.Series([e.pid for e in keep], dtype=pl.Int64, strict=False),
            "tid": pl.Series([e.tid for e in keep], dtype=pl.Int64, strict=False),
            "stream": pl.Series([a.stream for a in args], dtype=pl.Int64),
            "correlation": pl.Series([a.correlation for a in args], dtype=pl.Int64),
            "external_id": pl.Series([a.external_id for a in args], dtype=pl.Int64),
        }
    )
    return df


class _ByteStream:
    """Reads a plain or gzip file in blocks; gzip errors become TraceError."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            magic = f.read(2)
        self.gzipped = magic == b"\x1f\x8b"
        self._f = gzip.open(path, "rb") if self.gzipped else open(path, "rb")

    def read(self) -> bytes:
        try:
            return self._f.read(_READ_BLOCK)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"{self.path}: truncated or corrupt gzip ({e})") from None

    def close(self):
        self._f.close()


def _fail(path, what: str):
    raise TraceError(f"{path}: {what}")


def _decode_chunk(path, chunk) -> pl.DataFrame:
    """chunk: bytes-like holding a JSON array of events."""
    try:
        events = _decode_events(chunk)
    except msgspec.DecodeError as e:
        raise _ChunkError(str(e)) from None
    return _chunk_frame(events)


class _ChunkError(Exception):
    pass


def _split_tail(path, tail: bytes, header: bytes) -> tuple[pl.DataFrame, dict]:
    """``tail`` holds the last events, the closing ``]`` and the rest of the
    top-level object. Try the last few ``]`` as the array end."""
    end = len(tail)
    for _ in range(8):
        end = tail.rfind(b"]", 0, end)
        if end < 0:
            break
        try:
            meta = orjson.loads(header + b"[]" + tail[end + 1 :])
        except orjson.JSONDecodeError:
            continue
        body = tail[:end].strip()
        try:
            frame = _decode_chunk(path, b"[" + body + b"]") if body else _chunk_frame([])
        except _ChunkError as e:
            _fail(path, f"corrupt JSON in traceEvents ({e})")
        return frame, meta
    _fail(path, "truncated or corrupt JSON (traceEvents array or top-level object not closed)")


def _last_boundary(buf: bytes, lower: int):
    end = len(buf)
    while (pos := buf.rfind(b"}", lower, end)) >= 0:
        if m := _BOUNDARY.match(buf, pos):
            return m
        end = pos
    return None


def _decode_chunk_ipc(path: str, chunk: bytes) -> bytes:
    """Worker side of _Pool: decode a chunk, ship the frame back as Arrow IPC."""
    try:
        frame = _decode_chunk(path, chunk)
    except _ChunkError as e:
        raise TraceError(f"{path}: corrupt JSON in traceEvents ({e})") from None
    out = io.BytesIO()
    frame.write_ipc(out)
    return out.getvalue()


class _InProcess:
    def __init__(self, path):
        self.path, self.frames = path, []

    def submit(self, chunk):
        try:
            self.frames.append(_decode_chunk(self.path, chunk))
        except _ChunkError as e:
            _fail(self.path, f"corrupt JSON in traceEvents ({e})")

    def results(self) -> list[pl.DataFrame]:
        return self.frames

    def close(self):
        pass


class _Pool:
    """Decodes chunks in worker processes; at most 2 chunks per worker in flight
    so that memory stays bounded."""

    def __init__(self, path, workers: int):
        self.path, self.workers = str(path), workers
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        self.pending, self.frames = [], []

    def _collect(self, block: bool):
        while self.pending and (block or self.pending[0].done()):
            self.frames.append(pl.read_ipc(io.BytesIO(self.pending.pop(0).result())))

    def submit(self, chunk):
        self.pending.append(self.executor.submit(_decode_chunk_ipc, self.path, bytes(chunk)))
        if len(self.pending) > 2 * self.workers:
            wait(self.pending[:1])
        self._collect(block=False)

    def results(self) -> list[pl.DataFrame]:
        self._collect(block=True)
        return self.frames

    def close(self):
        self.executor.shutdown(wait=False, cancel_futures=True)


def _decoder(path: Path, size_hint: int):
    # One core stays with the reading process. TPTUNE_TRACE_WORKERS overrides
    # (1 = decode in process).
    workers = int(os.environ.get("TPTUNE_TRACE_WORKERS", min((os.cpu_count() or 1) - 1, _MAX_WORKERS)))
    if size_hint < _PARALLEL_MIN_BYTES or workers < 2:
        return _InProcess(path)
    return _Pool(path, workers)


def _read_frames(path: Path) -> tuple[list[pl.DataFrame], dict]:
    stream = _ByteStream(path)
    size_hint = path.stat().st_size * (5 if stream.gzipped else 1)
    decoder = _decoder(path, size_hint)
    try:
        buf = b""
        while not (m := _EVENTS_KEY.search(buf)):
            block = stream.read()
            if not block:
                _not_a_trace(path, buf)
            if len(buf) > (64 << 20):
                _fail(path, "not a Chrome trace (no traceEvents in the first 64 MiB)")
            buf += block
        header = buf[: m.end() - 1]
        # One bytearray, starting with "[", decoded in place through a
        # memoryview: at a boundary "}, <newline> {" the comma becomes "]" to
        # close this chunk and the byte before "{" becomes "[" to open the next.
        buf = bytearray(buf[m.end() - 1 :])
        searched = 0
        while True:
            block = stream.read()
            buf += block
            cut = _last_boundary(buf, max(0, searched - 64))
            searched = len(buf)
            if cut is not None:
                comma = buf.index(b",", cut.start())
                buf[comma] = ord("]")
                next_open = cut.end() - 2
                buf[next_open] = ord("[")
                with memoryview(buf) as view:
                    decoder.submit(view[: comma + 1])
                del buf[:next_open]
                searched = len(buf)
            if not block:
                break
        frame, meta = _split_tail(path, bytes(buf[1:]), header)
        frames = decoder.results()
        frames.append(frame)
        return frames, meta
    finally:
        decoder.close()
        stream.close()


def _not_a_trace(path, buf: bytes):
    try:
        doc = orjson.loads(buf)
    except orjson.JSONDecodeError:
        _fail(path, "not JSON or truncated (no traceEvents array found)")
    _fail(path, f"not a Chrome trace: JSON {type(doc).__name__} without a traceEvents array")


def _rank(path: Path, meta: dict) -> int | None:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=FRAME_SCHEMA)


def load_trace(path) -> LoadedTrace:
    """Load one rank's trace (``.json`` or ``.json.gz``).

    Raises TraceError (one line, naming the file) when the file is corrupt or
    truncated, is not a trace, or has no GPU kernels and no CPU ops.
    """
    if isinstance(path, LoadedTrace):
        return path
    path = Path(path)
    if not path.is_file():
        _fail(path, "no such file")
    frames, meta = _read_frames(path)
    frames = [f for f in frames if f.height] or [_empty_frame()]
    df = pl.concat(frames, how="vertical")
    del frames
    cat = pl.col("cat")
    gpu = df.filter(cat.is_in(GPU_CATS)).sort("ts")
    runtime = df.filter(cat.is_in(RUNTIME_CATS)).sort("ts")
    cpu = df.filter(cat.is_in(CPU_CATS)).sort("ts")
    del df
    if gpu.height == 0 and cpu.filter(pl.col("cat") == "cpu_op").height == 0:
        _fail(path, "no GPU kernels and no CPU ops in the trace")
    meta = {k: v for k, v in meta.items() if k != "traceEvents"}
    return LoadedTrace(str(path), _rank(path, meta), gpu, runtime, cpu, meta)
