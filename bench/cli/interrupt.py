"""Ctrl-C in the command line: whether the command's result is complete yet. ``bench.cli.main.entry`` installs
:func:`on_sigint`; a command calls :func:`finished` once its result is written (``bench report``), after which an
interrupt no longer changes the exit code. Its own module so a command module can call it without importing
``bench.cli.main`` (which imports every command module)."""

from __future__ import annotations

# set once the command's result is written (`finished`): from then on Ctrl-C no longer interrupts the process
_FINISHED = {"done": False}


def finished() -> None:
    """A command calls this once its result is complete (`bench report`: the report is written): an interrupt after
    it no longer changes the exit code (in a process started by ``bench.cli.main.entry``)."""
    _FINISHED["done"] = True


def on_sigint(*_) -> None:
    """SIGINT handler: KeyboardInterrupt while the command works, nothing once it has :func:`finished`."""
    if not _FINISHED["done"]:
        raise KeyboardInterrupt
