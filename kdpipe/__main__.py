"""``python -m kdpipe``: the command line (kdpipe.cli), run only from the kdpipe the workflow fingerprinted, from a
snapshot of its sources taken as the process starts (kdpipe.launch)."""

import sys

from kdpipe.launch import Snapshot, check_package, pause


def run() -> None:
    """Check the package, snapshot its sources, then run the command line from the snapshot."""
    wrong = check_package()
    if wrong:
        sys.exit(wrong)
    pause("snapshot")
    Snapshot().install()
    from kdpipe.cli import main  # (from the snapshot)

    sys.exit(main())


if __name__ == "__main__":  # (imported by name, e.g. by a docs check, it does nothing)
    run()
