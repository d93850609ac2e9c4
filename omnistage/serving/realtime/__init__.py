"""Realtime voice sessions (`WS /v1/realtime`): the OpenAI GA event set over ordinary requests through the
stages."""
