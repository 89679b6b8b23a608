"""`python -m sidecar` is the same as the `sidecar` console script."""

import sys

from sidecar.cli import main

sys.exit(main())
