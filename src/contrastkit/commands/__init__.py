"""Subcommands of the ``contrastkit`` command line (see :mod:`contrastkit.cli`).

One module per command (``add_arguments(parser)``, ``run(args)``); what several share is in
:mod:`contrastkit.commands.common`. Commands parse options, call the library
(:mod:`contrastkit.train`, :mod:`contrastkit.studies`, ...) and print; they hold no results
logic of their own.
"""
