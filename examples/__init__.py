"""Example jobs shipped with spotd (installed as ``spotd.examples``)."""
