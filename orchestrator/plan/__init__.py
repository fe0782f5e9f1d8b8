"""The plan of a run (one table of steps), its Celery tasks, and their coordination in Redis."""
