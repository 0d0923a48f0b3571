"""``python -m kdpipe``: the command line (kdpipe.cli), run only from the kdpipe the workflow fingerprinted
(kdpipe.launch)."""

import sys

from kdpipe.launch import check_package

wrong = check_package()
if wrong:
    sys.exit(wrong)
from kdpipe.cli import main  # noqa: E402 (after the check: a job of another checkout imports nothing more)

sys.exit(main())
