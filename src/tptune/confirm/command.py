"""The Megatron-LM command of one confirm launch: the model's real shapes on N layers, the workload, the
training loop's fixed settings, and one setting's TP-overlap flags; the environment it runs with.

Megatron-LM 0.19's argument names (megatron/training/arguments.py at core_v0.19.0, the wheel's
megatron/training): tests/confirm check the composed argv through Megatron's own parse_and_validate_args
where megatron-core imports, and against the committed snapshot of its option names
(``data/megatron_lm_args.txt``) everywhere.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tptune.errors import ConfigError
from tptune.model.spec import FP8_RECIPES, ModelConfig

RUNNER = Path(__file__).resolve().parent / "rank_runner.py"    # each rank of a launch group (confirm.group)
# Required on the lent machines (NVLink multicast off) and by Megatron with TP (one connection).
LAUNCH_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
              "UB_SKIPMC": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1"}
# Variables a launch must not inherit: a setting is confirmed as its files are written, and they carry none.
DROPPED_ENV = ("NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN")


def model_args(mc: ModelConfig, *, layers: int, tp: int, iters: int, micro_batches: int, seed: int) -> list[str]:
    """Megatron-LM arguments for ``layers`` layers of the model's shapes, the workload, mock data, and the
    confirm loop's fixed settings (every setting gets the same). ConfigError for what cannot be composed."""
    m, w = mc.model, mc.workload
    problems = []
    if m.is_mla:
        problems.append("multi_latent_attention: the confirm stage composes multi-head/GQA attention only")
    if m.vocab_size is None:
        problems.append("vocab_size: needed for the output layer (model.json has none)")
    act = m.activation_name
    if m.gated_mlp and act != "silu":
        problems.append(f"activation {act!r} gated: Megatron-LM's command line has --swiglu (gated silu) only")
    if not m.gated_mlp and act not in ("gelu", "squared_relu"):
        problems.append(f"activation {act!r}: Megatron-LM's command line has gelu (default) or --squared-relu")
    if w.dtype not in ("bf16", "fp8"):
        problems.append(f"workload.dtype {w.dtype!r}: the confirm stage trains bf16 or fp8")
    if problems:
        raise ConfigError("confirm", problems)
    a = ["--num-layers", layers, "--hidden-size", m.hidden_size, "--ffn-hidden-size", m.ffn_hidden_size,
         "--num-attention-heads", m.num_attention_heads, "--kv-channels", m.kv_channels]
    if m.num_query_groups != m.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", m.num_query_groups]
    a += ["--seq-length", w.seq_length, "--max-position-embeddings", w.seq_length,
          "--micro-batch-size", w.micro_batch_size, "--global-batch-size", w.micro_batch_size * micro_batches,
          "--tensor-model-parallel-size", tp, "--sequence-parallel",
          "--normalization", "RMSNorm", "--position-embedding-type", "rope",
          "--attention-dropout", 0, "--hidden-dropout", 0]
    if m.gated_mlp:
        a.append("--swiglu")
    elif act == "squared_relu":
        a.append("--squared-relu")
    if not m.add_bias_linear:
        a.append("--disable-bias-linear")
    if m.add_qkv_bias:
        a.append("--add-qkv-bias")
    if m.untie_embeddings_and_output_weights:
        a.append("--untie-embeddings-and-output-weights")
    if m.is_moe:
        a += ["--num-experts", m.num_moe_experts, "--moe-router-topk", m.moe_router_topk,
              "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"]
        if m.moe_ffn_hidden_size:
            a += ["--moe-ffn-hidden-size", m.moe_ffn_hidden_size]
        if m.moe_shared_expert_intermediate_size:
            a += ["--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size]
        # the first layer dense when the model has dense layers, as the layer stage's block (ModelSpec.block_pattern)
        pattern = m.block_pattern(layers)
        if not all(pattern):
            a += ["--moe-layer-freq", "[" + ",".join("1" if x else "0" for x in pattern) + "]"]
    a += ["--bf16"]
    if w.is_fp8:
        a += ["--fp8-format", w.fp8_format or "hybrid", "--fp8-recipe", FP8_RECIPES[w.recipe or "delayed"][1]]
    a += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", m.vocab_size,
          "--no-gradient-accumulation-fusion", "--timing-log-level", 0, "--log-interval", 1,
          "--train-iters", iters, "--eval-iters", 0, "--eval-interval", iters + 1,
          "--lr", "1e-4", "--lr-decay-style", "constant", "--weight-decay", "0.1", "--clip-grad", "1.0",
          "--seed", seed, "--distributed-backend", "nccl"]
    return [str(x) for x in a]


def flags_file_args(path: str | Path) -> list[str]:
    """The flags of a ``megatron_flags*.txt`` as written (one flag with its value a line, ``#`` comments), with
    ``--tp-comm-overlap-cfg``'s file resolved beside the flags file, as a user loading the run folder does.
    ConfigError when the file or the yaml it names is missing, or it needs a switch with no flag."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), ["no such file: the emitted set's Megatron-LM flags (tptune decide writes it)"])
    out, needs = [], []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("#") and "has no command-line flag" in line:
            needs.append(line.lstrip("# "))
        if not line or line.startswith("#"):
            continue
        out += shlex.split(line)
    if needs:
        raise ConfigError(str(path), [f"the set needs a switch Megatron-LM's command line cannot give: {n}"
                                      for n in needs])
    if "--tp-comm-overlap-cfg" in out:
        i = out.index("--tp-comm-overlap-cfg") + 1
        if i >= len(out):
            raise ConfigError(str(path), ["--tp-comm-overlap-cfg has no file after it"])
        cfg = Path(out[i]) if Path(out[i]).is_absolute() else path.parent / out[i]
        if not cfg.is_file():
            raise ConfigError(str(path), [f"--tp-comm-overlap-cfg {out[i]}: no such file beside it ({cfg})"])
        out[i] = str(cfg.resolve())
    return out


def merged(base: list[str], overlap: list[str]) -> list[str]:
    """``base`` then ``overlap``, without repeating a bare switch both give (``--sequence-parallel``)."""
    return base + [f for f in overlap if not (f.startswith("--") and f in base and _is_switch(overlap, f))]


def _is_switch(argv: list[str], flag: str) -> bool:
    i = argv.index(flag)
    return i + 1 >= len(argv) or argv[i + 1].startswith("--")


def launcher_argv(nproc: int, port: int, entry: str | Path = RUNNER, python: str = sys.executable) -> list[str]:
    """``torch.distributed.run`` on one node: ``nproc`` ranks of ``entry``, its rendezvous on 127.0.0.1:``port``."""
    return [python, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0",
            "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port), str(entry)]


def launch_env(base: dict[str, str], tmp: str | Path | None = None) -> dict[str, str]:
    """The environment of the launches: ``base`` without what a setting must not inherit, and the machines'
    required variables; ``tmp``: a temp folder (TMPDIR) of its own (the launch group gives each launch one)."""
    env = {k: v for k, v in base.items() if k not in DROPPED_ENV}
    env.update(LAUNCH_ENV)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return env


def add_tptune_args(parser):
    """tptune's training entry's own options, added to Megatron-LM's parser (confirm.trainer)."""
    g = parser.add_argument_group("tptune", "tptune's confirm entry")
    g.add_argument("--tptune-timing", default=None, help="rank 0 writes the GPU-timed iterations here (JSON)")
    g.add_argument("--tptune-packed", default=None, help="packed THD micro-batches: JSON {capacity, bins}")
    g.add_argument("--tptune-data-seed", type=int, default=1234, help="the data's seed")
    return parser


def entry_args(*, seed: int, packed: str | Path | None = None) -> list[str]:
    """tptune's training entry's own arguments (confirm.trainer): its GPU-timed iterations written to the
    launch's folder (``{workdir}``, filled in per launch), the data seed, packed micro-batches when given."""
    a = ["--tptune-timing", "{workdir}/timing.json", "--tptune-data-seed", str(seed)]
    if packed is not None:
        a += ["--tptune-packed", str(packed)]
    return a


def checkout_script(path: str | Path) -> Path:
    """A user's Megatron-LM checkout's ``pretrain_gpt.py``; ConfigError naming the setting when it is not one."""
    root = Path(path).expanduser()
    script = root / "pretrain_gpt.py"
    if not root.is_dir() or not script.is_file() or not (root / "megatron" / "training").is_dir():
        raise ConfigError("confirm.megatron_lm", [f"{path}: not a Megatron-LM checkout (expected a folder with "
                                                  "pretrain_gpt.py and megatron/training/)"])
    return script.resolve()
