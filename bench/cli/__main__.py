"""``python -m bench.cli ...`` = ``bench ...``."""

import sys

try:  # Ctrl-C while the command line is imported: one line, not a traceback
    from bench.cli.main import entry
except KeyboardInterrupt:
    print("bench: interrupted", file=sys.stderr)
    sys.exit(130)
entry()
