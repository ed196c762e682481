"""The Docker engine: containers, their networks, the packet filter, labels."""
