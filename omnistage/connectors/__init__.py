"""Connectors move bulk tensors between stages; control messages only carry small references."""

from omnistage.connectors.base import Payload, TensorRef, decode_payload, encode_payload
from omnistage.connectors.shm import ShmConnector, sweep_stale_segments

__all__ = ["Payload", "TensorRef", "ShmConnector", "decode_payload", "encode_payload", "sweep_stale_segments"]
