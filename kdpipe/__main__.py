"""``python -m kdpipe``: the command line (kdpipe.cli), run only from the kdpipe the workflow fingerprinted
(kdpipe.launch), as a copy of the workflow's warm server when one is listening and the copy would be the same job
(kdpipe.warm), else started afresh."""

import sys

from kdpipe.launch import check_package
from kdpipe.warm import run_warm

wrong = check_package()
if wrong:
    sys.exit(wrong)
status = run_warm(sys.argv[1:])
if status is None:
    from kdpipe.cli import main

    status = main()
sys.exit(status)
