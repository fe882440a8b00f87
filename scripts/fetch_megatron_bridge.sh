#!/usr/bin/env bash
# Unpack Megatron-Bridge 0.3.1 (the newest on the package registry) into .cache/megatron-bridge, outside the venv,
# for tests/emit/test_bridge_comm_overlap.py: the emitted tp_overlap_cfg_nemo.py through Bridge's own
# CommOverlapConfig. With it, only what importing megatron.bridge.training.comm_overlap and its model provider
# needs: megatron-core 0.16.1 (Bridge pins megatron-core<0.17; the test also runs Bridge on .cache/megatron-lm's
# 0.19.2 when scripts/fetch_megatron_lm.sh has run) and omegaconf 2.3.0 with its antlr4 runtime 4.9.3 (what
# Bridge's hydra-core<=1.3.2 pin resolves omegaconf to; models/config.py imports it). No other dependency of
# Bridge is resolved: the rest (transformers, transformer-engine, wandb, mamba-ssm, ...) is reached only
# through Bridge's package __init__ files, which the test does not run (its module doc says why).
# Also Transformer Engine 2.20.2's module/base.py (from the pure-Python transformer-engine wheel, kept outside
# the import path), whose initialize_ub the test runs on the dict Bridge hands TE.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.cache/megatron-bridge}"
if [ -f "$dest/.complete" ]; then echo "$dest"; exit 0; fi
rm -rf "$dest.part"
python -m pip install -q --no-deps --target "$dest.part/site" megatron-bridge==0.3.1 megatron-core==0.16.1 \
    omegaconf==2.3.0 antlr4-python3-runtime==4.9.3
python -m pip download -q --no-deps --only-binary :all: -d "$dest.part/wheels" transformer-engine==2.20.2
python - "$dest.part" <<'EOF'
import sys, zipfile
from pathlib import Path
part = Path(sys.argv[1])
(whl,) = (part / "wheels").glob("transformer_engine-2.20.2-*.whl")
with zipfile.ZipFile(whl) as z:
    (part / "te-2.20.2").mkdir()
    (part / "te-2.20.2" / "base.py").write_bytes(z.read("transformer_engine/pytorch/module/base.py"))
EOF
rm -rf "$dest.part/wheels"
touch "$dest.part/.complete"
rm -rf "$dest" && mv "$dest.part" "$dest"
echo "$dest"
