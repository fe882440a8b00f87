"""Before measuring: what this machine offers (GPUs, Transformer Engine, the GPU's compute capability)
and whether it can run what the run config asks. Settings resolution itself only reads the config and
the model files (settings.resolve); the CLI and the workflow's rules resolve through ``resolve_here``."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tptune.errors import ConfigError, TptuneError
from tptune.measure import nvml
from tptune.measure.gpupool import available_ids, cpu_slot_ids, pool_folder, slurm_allocation
from tptune.model.plan import cpu_size_ratio
from tptune.settings.resolve import Host, Settings, resolve
from tptune.te.fp8 import device_capability, recipe_device_problem


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def probe_host(check_hardware: bool = True) -> Host:
    """This machine's GPUs and Transformer Engine, the first GPU's memory (NVML, for the workload check);
    its compute capability only when the
    hardware is checked (a step that reads recorded measurements judges an FP8 recipe by hardware.gpu):
    from NVML, else from torch where NVML cannot say (a GPU named as CUDA_VISIBLE_DEVICES renumbers it)."""
    gpu_ids = tuple(available_ids())
    capability = None
    if gpu_ids and check_hardware:
        capability = nvml.compute_capability(gpu_ids[0]) or device_capability()
    memory = nvml.total_memory(gpu_ids[0]) if gpu_ids else None
    return Host(gpu_ids=gpu_ids, te_available=te_available(), capability=capability, gpu_memory=memory)


def resolve_here(config: dict, source: str = "config", base_dir: str | Path = ".", check_hardware: bool = True,
                 node_tps: list[int] | None = None) -> Settings:
    """The run's settings on this machine (settings.resolve with this host), and with ``check_hardware``
    whether it can run them: raises ConfigError listing every problem.

    ``check_hardware=False`` is for steps that only read recorded measurements (search steps,
    decisions, report): they run anywhere, e.g. on a laptop with a GPU node's outputs copied over;
    and for a dry run or a submit host (TPTUNE_SUBMIT_ONLY=1), which measure nothing here.
    With ``check_hardware``, this node must hold the TP sizes ``node_tps`` (default: all of
    ``tp_sizes``, the workflow's parse-time check; a measuring job gives its own TP, as a Slurm job
    is granted only the GPUs of its TP)."""
    host = probe_host(check_hardware)
    s = resolve(config, host, source=source, base_dir=base_dir)
    if check_hardware:
        problems = host_problems(s, host, s.tp_sizes if node_tps is None else sorted(node_tps))
        if problems:
            raise ConfigError(source, problems)
    return s


def host_problems(s: Settings, host: Host, tps: list[int]) -> list[str]:
    """What this machine lacks for the run: GPUs and Transformer Engine for the te backend, GPUs (or CPU
    worker slots) for its TP sizes, an FP8 recipe its GPU can run, a worker pool folder (launcher.pool_dir)
    this user can make and keep private (gpupool.pool_folder: made here, as the run's first job would)."""
    out = []
    if s.launcher.pool_dir is not None:
        try:
            pool_folder(s.launcher.pool_dir)
        except TptuneError as exc:
            out.append(str(exc))
    if s.backend == "te" and not host.gpu_ids:
        out.append("field 'backend': te needs CUDA GPUs and none are visible (use backend: torch; on a "
                   "submit host without GPUs, e.g. a Slurm login node, set TPTUNE_SUBMIT_ONLY=1)")
    if s.backend == "te" and not host.te_available:
        out.append("field 'backend': te needs transformer_engine and megatron.core (pip install '.[gpu]'; "
                   "on a submit host without them set TPTUNE_SUBMIT_ONLY=1)")
    out.extend(node_problems(tps, list(host.gpu_ids), s.launcher.cpu_slots))
    if host.capability is not None and s.model.workload.is_fp8 and s.backend == "te":
        why = recipe_device_problem(s.model.workload.recipe, capability=host.capability, gpu=s.hardware.gpu)
        if why:
            out.append(f"field 'workload.recipe': {why}")
    return out


def node_problems(tps: list[int], gpu_ids: list[str], cpu_slots: int) -> list[str]:
    """TP sizes this node cannot hold: a TP group needs TP GPUs (on CPU, TP of launcher.cpu_slots worker
    slots). ``gpu_ids``: the GPUs this process may use (gpupool.available_ids); none: a CPU run."""
    if gpu_ids:
        too_big = [tp for tp in tps if tp > len(gpu_ids)]
        if not too_big:
            return []
        if slurm_allocation() is not None:
            where = "granted by Slurm to this job"
        elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            where = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}"
        else:
            where = "listed by the driver"
        return [f"field 'tp_sizes': this node shows {len(gpu_ids)} GPU(s) ({where}: {', '.join(gpu_ids)}) and "
                f"the run asks for TP sizes {tps}: TP={', '.join(map(str, too_big))} cannot run here. Lower "
                f"tp_sizes, or run on a node with {max(too_big)} GPUs (a Slurm submit host sets "
                f"TPTUNE_SUBMIT_ONLY=1: its jobs are checked where they run)"]
    too_big = [tp for tp in tps if tp > cpu_slots]
    if not too_big:
        return []
    return [f"field 'tp_sizes': no GPU here, so ranks run on CPU worker slots, and launcher.cpu_slots = "
            f"{cpu_slots} slot(s) cannot hold the TP sizes asked {tps} (TP={', '.join(map(str, too_big))}). "
            f"Lower tp_sizes or raise launcher.cpu_slots"]


CPU_WARN_RATIO = 10.0     # a model this many times the CPU default's work per iteration is warned about


def cpu_notes(s: Settings, gpus_resource: int | None = None) -> list[str]:
    """What a run without a GPU should say before it starts (the workflow at parse time, tptune validate): a
    model whose ops take CPU_WARN_RATIO times the CPU default's GEMM work per iteration or more (its run takes
    that many times the default's 1 to 2 minutes: hours for an 8B model), and Snakemake's ``--resources
    gpus=N`` (``gpus_resource``) beyond the CPU worker pool, which counts slots, not GPUs. [] on a GPU run."""
    if s.device == "cuda":
        return []
    out = []
    tp = min(s.tp_sizes)
    ratio = cpu_size_ratio(s.model, tp, s.ops)
    if ratio >= CPU_WARN_RATIO:
        out.append(f"tptune: the CPU path (backend torch over gloo, no GPU here) is for running the whole machinery "
                   f"anywhere, not for measuring a model to train: {s.model.model.name}'s ops take {ratio:.0f}× the "
                   f"CPU default's GEMM work per iteration (TP {tp}), so expect this run to take about {ratio:.0f}× "
                   "the default's 1 to 2 minutes. Measure it on a GPU node (backend te); try the CPU path with "
                   "config/models/tiny.yaml")
    slots = len(cpu_slot_ids(s.launcher.cpu_slots))
    if gpus_resource is not None and gpus_resource > slots:
        out.append(f"tptune: no GPU here: the measuring jobs share {slots} CPU worker slots (the cores this process "
                   f"may run on, at most launcher.cpu_slots = {s.launcher.cpu_slots}), and --resources "
                   f"gpus={gpus_resource} counts them as GPUs: Snakemake may start more measuring jobs at once than "
                   f"the pool holds, and those beyond it wait for a slot. --cores {slots} --resources gpus={slots} "
                   "runs as many as it holds")
    return out
