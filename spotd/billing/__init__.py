"""The ledger, spotd's one cost, and what is read from it: reports, charts, templates."""
