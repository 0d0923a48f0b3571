"""``python -m kdpipe``: the command line (kdpipe.cli), run as a copy of the workflow's warm server when one is
listening and the copy would be the same job (kdpipe.core.warm), else started afresh."""

import sys

from kdpipe.core.warm import run_warm

status = run_warm(sys.argv[1:])
if status is None:
    from kdpipe.cli import main

    status = main()
sys.exit(status)
