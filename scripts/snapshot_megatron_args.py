"""Write src/tptune/data/megatron_lm_args.txt: every option of Megatron-LM's argument parser
(megatron.training.arguments.add_megatron_arguments) and whether it takes a value, the snapshot that
tests/confirm checks the confirm stage's composed command against where megatron-core does not import.
    python scripts/snapshot_megatron_args.py        # with megatron-core (the version below) importable
"""
import argparse
import sys
from pathlib import Path

from megatron.core.package_info import __version__
from megatron.training.arguments import add_megatron_arguments

SOURCE = "megatron-core 0.19.2 wheel, megatron/training/arguments.py (add_megatron_arguments)"
out = Path(__file__).resolve().parents[1] / "src" / "tptune" / "data" / "megatron_lm_args.txt"
if __version__ != "0.19.2":
    sys.exit(f"megatron-core {__version__} imports here; the snapshot is of 0.19.2")
parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
rows = sorted({(opt, "switch" if a.nargs == 0 else "value")
               for a in parser._actions for opt in a.option_strings if opt.startswith("--")})
out.write_text(f"# Megatron-LM's command-line options: {SOURCE}\n"
               "# <option> switch|value; written by scripts/snapshot_megatron_args.py\n"
               + "".join(f"{o} {k}\n" for o, k in rows))
print(f"{out}: {len(rows)} options")
