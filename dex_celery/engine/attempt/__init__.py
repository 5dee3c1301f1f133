"""The attempt's room: what a worker does with one attempt (claim, write fence, run the tool
under its heartbeat, finish) and how its outcome reaches SQL (the outcome writer)."""
