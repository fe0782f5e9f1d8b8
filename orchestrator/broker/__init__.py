"""The broker and the processes: the Celery app, its transport, outages, heartbeats, time
limits, worker processes, the embedded Redis."""
