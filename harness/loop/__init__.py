"""The agent loop: a model's turns, its tool calls through the session, checkpoints, context budget."""
