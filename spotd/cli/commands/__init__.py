"""The ``spotd`` commands, one module per group; :mod:`spotd.cli.app` registers them."""
