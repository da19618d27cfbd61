"""``python -m sentemb.cli``: the same command line as ``sentemb`` and ``python -m sentemb``."""

import sys

from . import main

sys.exit(main())
