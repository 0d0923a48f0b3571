"""``python -m kdpipe``: the command line (kdpipe.cli), run only from the kdpipe the workflow fingerprinted, from a
snapshot of its sources taken as the process starts (kdpipe.launch)."""

import sys

from kdpipe.launch import Snapshot, check_package, pause

wrong = check_package()
if wrong:
    sys.exit(wrong)
pause("snapshot")
Snapshot().install()
from kdpipe.cli import main  # noqa: E402 (from the snapshot)

sys.exit(main())
