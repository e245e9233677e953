"""What ``spotd demo`` says to a reader, as docs/first-day.md shows it.

tests/cli/test_demo.py runs the demo once and checks these lines with its figures;
tests/test_first_day.py checks they are on the page, so the page, the command and
the test cannot drift apart without a failure.
"""

from __future__ import annotations

DEMO_SAYS = ("600 simulated seconds per real second", ": succeeded", "preemptions:", "(matches)")
"""Parts of the demo's words the first-day page promises the reader."""
