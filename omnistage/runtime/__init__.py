"""The stage-graph runtime: orchestrator, request state, stage clients and pools."""
