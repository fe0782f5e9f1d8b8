"""The command line and what it prints: commands, progress, the live view, status, Flower."""
