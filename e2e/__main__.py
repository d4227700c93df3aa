import sys

from e2e.cli import main

sys.exit(main())
