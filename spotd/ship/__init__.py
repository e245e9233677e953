"""Shipping a job's working directory: pack it on the submitting machine, store it
once by content, unpack it on every node of every attempt."""
