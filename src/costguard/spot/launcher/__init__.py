"""Provider adapters for the spot launcher, looked up lazily by name."""
