"""The one path of a tool call: calls and results, errors, registry, schemas, validation, policy, the session."""
