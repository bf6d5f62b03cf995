"""Activity code: everything that touches the world (HTTP to models, tools, callbacks)."""
