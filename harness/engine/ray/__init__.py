"""The Ray engine: sandboxes on the nodes of a Ray cluster, each node driving its own Docker engine."""
