#!/bin/bash
# Re-derive a finished run's search results, TP decisions, configs and report from its recorded
# sessions, with this checkout's decision code; no GPU needed.
#   bash scripts/rederive_decisions.sh outputs/<run>
set -euo pipefail
tptune rederive "$1"
