"""Loopback fakes of cloud APIs for the adapter tests (no test reaches a real cloud)."""
