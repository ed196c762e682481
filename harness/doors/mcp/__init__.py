"""The MCP door: tool service, protocol handlers, stdio and streamable HTTP transports."""
