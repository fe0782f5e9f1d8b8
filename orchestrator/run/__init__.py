"""The run folder: records, the store that reads and writes them, ids, the lease, fencing."""
