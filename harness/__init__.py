"""callbox harness: everything on the host side.

It validates and authorizes tool calls, starts disposable sandboxes (``engine``),
talks to the agent inside them over gRPC (``agent_client``) and shapes results.
"""
