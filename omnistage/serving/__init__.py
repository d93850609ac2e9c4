"""The OpenAI-compatible HTTP server: `create_app` wires routes over `AsyncOmni` runtimes, `server.serve`
runs it (what `omnistage serve` calls)."""
