"""Where sandboxes live: the engine and sandbox interface, the sandbox spec, the agent client, the image."""
