"""The `raylight` command line: thin parsing over the library; exit 2 for bad input."""

from raylight.cli.main import app, main

__all__ = ["app", "main"]
