"""Is it any good? Record and replay a run's model exchanges (cassette.py), datasets of
tickets with expectations (dataset.py), `ticketgraph eval` over them (runner.py, scoring.py),
layer ablations with paired figures (ablations.py, stats.py) and the report (report.py)."""
