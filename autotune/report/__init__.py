"""Reports: the recommendation (`study best`), trial tables and exports."""
