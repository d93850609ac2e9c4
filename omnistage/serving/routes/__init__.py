"""One module per API surface; each exposes `router`."""
