"""Provider adapters: the simulated market and the clouds."""
