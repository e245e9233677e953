"""spotd: a spot-market scheduler daemon for GPU training."""

__version__ = "0.1.0"
