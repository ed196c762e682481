"""Model adapters: OpenAI Responses and Chat Completions, Anthropic Messages, scripted."""
