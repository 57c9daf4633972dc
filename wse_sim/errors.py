"""The CS system's refusals: a gRPC status code and a message that says what is wrong."""
from __future__ import annotations

import grpc


class CSError(Exception):
    """A request the CS system refuses; the servicer turns it into the call's status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> CSError:
    return CSError(grpc.StatusCode.INVALID_ARGUMENT, message)
