#!/bin/bash
# The device tool carries the working tree (tracked and untracked-not-ignored files) plus the carried
# paths, 64 MiB in all, and results/ alone is ~60 MB: the bundle's wheels (TE 31 MB, the other wheels
# 17 MB, polars 38 MB) no longer fit beside it. No device command reads results/, so for the calls of a
# lease, take it out of what travels, then put it back:
#   bash scripts/device_tree.sh lean      # results/ out of the index and ignored (the files stay on disk)
#   ... device calls: carry [".device-te1", ".device-py"], then [".device-polars"], then the runs ...
#   bash scripts/device_tree.sh restore   # the index from HEAD again, results/ no longer ignored
# Commit nothing in between: the index then records results/ as deleted (`lean` refuses to start with
# staged changes, `status` says which state the checkout is in).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=.git/info/exclude
case "${1:-status}" in
  lean)
    if ! git diff --cached --quiet; then echo "device_tree.sh: staged changes; commit or unstage them first" >&2; exit 1; fi
    git rm -r -q --cached results
    grep -qx 'results/' "$exclude" || echo 'results/' >> "$exclude"
    echo "lean: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked; restore before committing" ;;
  restore)
    git reset -q -- results
    sed -i '/^results\/$/d' "$exclude"
    echo "restored: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked" ;;
  status)
    if grep -qx 'results/' "$exclude"; then echo "lean (results/ out of the index): restore before committing"; else echo "normal"; fi ;;
  *) echo "usage: $0 lean|restore|status" >&2; exit 2 ;;
esac
