"""Configuration: the environment, ticketgraph.toml's tables, and the two laid over each other
into a run's settings."""
