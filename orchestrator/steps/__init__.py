"""The steps of a run as plain functions, and what they call: the router's reply, the gate,
prompts, agents, tools and their sandbox, the report."""
