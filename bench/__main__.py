"""``python -m bench ...`` = ``bench ...`` (the same entry: its SIGINT / SIGTERM handlers and exit codes; calling
``main`` alone left a SIGTERM before the training to end the process silently, without the command's line)."""

from bench.cli import entry

entry()
