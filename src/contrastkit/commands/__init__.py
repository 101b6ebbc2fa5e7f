"""Subcommands of the ``contrastkit`` command line (see :mod:`contrastkit.cli`)."""
