"""Templates: images built on this host from a recipe of steps, cached, kept in a store."""
