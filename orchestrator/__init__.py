"""ticketgraph's graph: the plan of a run on Celery, its steps, the run folder, intake, the
broker and worker processes, configuration, and the command line."""
