"""The ``michelangelo`` command line."""

from michelangelo.cli._main import main

__all__ = ["main"]
