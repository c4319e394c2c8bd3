"""The codec compiled from the specs: code generation, the runtime, the C decoder/scanner and its wire programs."""

from kinspect.protocol.codec.codec import (
    Codec,
    CompiledStruct,
    DecodedRequest,
    DecodedResponse,
    RequestHeader,
    correlation_id_of_response,
    request_header_version,
    response_header_version,
)

__all__ = ["Codec", "CompiledStruct", "DecodedRequest", "DecodedResponse", "RequestHeader",
           "correlation_id_of_response", "request_header_version", "response_header_version"]
