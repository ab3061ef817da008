"""`python -m bench`: the `bench` command line."""

import sys

from bench.cli import main

sys.exit(main())
