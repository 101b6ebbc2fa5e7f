"""``python -m contrastkit`` (also what ``torchrun -m contrastkit`` runs)."""

from contrastkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
