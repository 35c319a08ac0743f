"""``python -m training ...``: the fixture trainer's command line (see training.cli)."""

import sys

from training.cli import main

sys.exit(main())
