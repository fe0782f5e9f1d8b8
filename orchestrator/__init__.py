"""The ticket graph: Celery app, nodes as tasks, the canvas, run state, trace and the CLI."""
