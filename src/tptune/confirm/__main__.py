"""python -m tptune.confirm outputs/<run> [...]: tptune confirm without the rest of the CLI (no polars needed)."""
import sys

from tptune.confirm.entry import main

sys.exit(main())
