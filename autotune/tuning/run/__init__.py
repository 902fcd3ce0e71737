"""Running a study: creating it, this process as one of its controllers, lanes, claims,
recovery, heartbeats and the events a run reports (docs/parallel.md, docs/faults.md)."""

__all__: list[str] = []
