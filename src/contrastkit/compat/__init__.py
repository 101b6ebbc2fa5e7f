"""Drop-in classes for the contrastive losses users already call, one module per peer library:
the peer's names, constructor signature, defaults, forward signature and return convention,
computed by contrastkit's losses (dense, memory-linear tiled, distributed), so that changing
one import gives the same numbers with contrastkit's memory.

* :mod:`contrastkit.compat.info_nce`: info-nce-pytorch's ``InfoNCE`` and ``info_nce``.
* :mod:`contrastkit.compat.pml`: pytorch-metric-learning's ``NTXentLoss`` and ``SupConLoss``.
* :mod:`contrastkit.compat.lightly`: lightly's ``NTXentLoss`` (its memory bank too), ``DCLLoss``
  and ``DCLWLoss``.
* :mod:`contrastkit.compat.open_clip`: open_clip's ``ClipLoss`` and ``SigLipLoss``.

Where a peer's behaviour differs from contrastkit's core (its defaults, a temperature the core
refuses), the compat class keeps the peer's and its docstring says so; docs/migrating.md lists
the one-line change and the differences. Depends on :mod:`contrastkit.losses` and torch only.
"""

__all__: list = []  # the peers' classes live in their modules (one per peer)
