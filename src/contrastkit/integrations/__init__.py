"""Integrations of contrastkit with other training frameworks, each an optional extra.

:mod:`contrastkit.integrations.lightning`: :class:`~contrastkit.integrations.lightning.ContrastiveModule`,
a ``lightning.LightningModule`` built from the pieces of ``contrastkit pretrain``, and
:class:`~contrastkit.integrations.lightning.ContrastiveDataModule` (``pip install
'contrastkit[lightning]'``).

This package itself imports no framework: importing ``contrastkit`` or
``contrastkit.integrations`` never imports Lightning; only importing the integration's own
module does.
"""

__all__: list = []
