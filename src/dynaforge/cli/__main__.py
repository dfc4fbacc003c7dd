"""`python -m dynaforge.cli`."""

import sys

from dynaforge.cli import main

sys.exit(main())
