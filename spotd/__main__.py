"""``python -m spotd``: the same as the ``spotd`` console script."""

from spotd.cli import main

main()
