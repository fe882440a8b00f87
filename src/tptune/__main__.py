import sys

from tptune.cli.main import main

sys.exit(main())
