"""``python -m sentemb``: the same as the ``sentemb`` command."""

import sys

from .cli import main

sys.exit(main())
