"""The upkeep room: what moves calls nobody else moves (the sweeper), settles unknown outcomes
(reconcile), bounds history (retention) and holds writes (the write freeze)."""
