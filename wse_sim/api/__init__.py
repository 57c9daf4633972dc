"""The CS API: protobuf messages and gRPC stubs shared by the CS, the coordinator and workers.

Regenerate the *_pb2 modules with `make proto` after editing cs_api.proto.
"""
from wse_sim.api import cs_api_pb2 as pb  # noqa: F401
from wse_sim.api import cs_api_pb2_grpc as rpc  # noqa: F401

# Batches and weight chunks above gRPC's default 4 MB message are fine, on both sides.
UNLIMITED_MESSAGES = (("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1))
