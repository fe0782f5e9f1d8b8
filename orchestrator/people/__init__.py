"""The person's half of the loop: what waits for a person across runs (queue), handling a
ticket, auditing a share of the passes, the labels those verdicts leave, and replaying the
deterministic gate over the labels (read from the run folders: no Redis, no workers)."""
