import sys

from kdpipe.cli import main

sys.exit(main())
