"""The CS API: protobuf messages and gRPC stubs shared by the CS, the coordinator and workers.

Regenerate the *_pb2 modules with `make proto` after editing cs_api.proto.
"""
from cs_api import cs_api_pb2 as pb  # noqa: F401
from cs_api import cs_api_pb2_grpc as rpc  # noqa: F401

# The largest message either side sends or receives (every channel and server): a batch of
# a program's inputs or a step's streamed outputs is at most MAX_BATCH_BYTES (wse_sim.limits
# refuses larger programs at Load), plus room for names and shapes.
MAX_BATCH_BYTES = 256 << 20
MAX_MESSAGE_BYTES = MAX_BATCH_BYTES + (1 << 20)
MESSAGE_OPTIONS = (("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES))
