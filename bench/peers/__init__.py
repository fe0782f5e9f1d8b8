"""Peers that run ticketgraph's scaled workload, so benchmarks can compare wall times.

- `langgraph_peer`: the same graph as a plain LangGraph `StateGraph` in one process.
- `seed_script`: the lesson's own `orchestrate.mjs` (seed 003), extracted and run with node.

Both report a `result.PeerResult`; neither is imported by ticketgraph itself.
"""
