#!/usr/bin/env bash
# Unpack megatron-core 0.19.2 (its wheel carries megatron/training, Megatron-LM's parse_args/validate_args) and
# triton (megatron.training imports it) into .cache/megatron-lm, outside the venv, for
# tests/confirm/test_confirm_command.py's check of the confirm stage's command through Megatron's own parser.
# No dependencies are resolved: the test stands in for nothing else (tests/confirm/megatron_validate.py).
# megatron-core 0.19.2 says Python >= 3.12; its cp311 wheel's parser runs on 3.11, hence --ignore-requires-python.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.cache/megatron-lm}"
if [ -f "$dest/.complete" ]; then echo "$dest"; exit 0; fi
rm -rf "$dest.part"
python -m pip install -q --no-deps --ignore-requires-python --target "$dest.part" megatron-core==0.19.2 triton==3.9.0
touch "$dest.part/.complete"
rm -rf "$dest" && mv "$dest.part" "$dest"
echo "$dest"
