"""contrastkit: contrastive representation learning around the temperature-scaled InfoNCE loss.

Importing the package is cheap: subpackages (``losses``, ``analysis``, ``data``, ...) are
imported on use, and only ``contrastkit.losses`` is guaranteed to need nothing but torch.
"""

__version__ = "0.1.0"
