"""``python -m spotd.agent -- COMMAND [ARG...]``: run the agent."""

import sys

from spotd.agent.runner import main

sys.exit(main())
