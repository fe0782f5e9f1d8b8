"""Intake: what inbox/ holds, the ticket files, and claiming them into a run."""
