"""``python -m bench.cli ...`` = ``bench ...``."""

from bench.cli import entry

entry()
