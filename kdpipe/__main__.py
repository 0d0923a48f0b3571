"""``python -m kdpipe``: the command line (kdpipe.cli)."""

import sys

from kdpipe.cli import main

sys.exit(main())
