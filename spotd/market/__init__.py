"""The market as the daemon sees it: offerings cached per provider, pool statistics."""
