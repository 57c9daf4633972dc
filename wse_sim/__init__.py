"""The simulated CS system: a gRPC server that runs compiled programs in layer-pipelined mode.

Imports numpy, grpc and the CS API (`cs_api`) only: never TensorFlow, never launcher.
"""
