"""Reports: the recommendation (`study best`), trial tables and exports."""

__all__: list[str] = []
