"""Exports one two-span trace through Python's real OTLP exporter; prints its trace id.

Usage: export.py grpc|http ENDPOINT [CA_CERT]
With CA_CERT (PEM), the exporter speaks TLS and trusts only that certificate.
"""
import sys

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode


def main() -> None:
    transport, endpoint = sys.argv[1], sys.argv[2]
    ca_cert = sys.argv[3] if len(sys.argv) > 3 else None
    if transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        if ca_cert:
            import grpc

            with open(ca_cert, "rb") as pem:
                credentials = grpc.ssl_channel_credentials(pem.read())
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=False, credentials=credentials)
        else:
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, certificate_file=ca_cert)
    provider = TracerProvider(resource=Resource.create({"service.name": "orders-py"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("budgetscope-python-test")
    with tracer.start_as_current_span(
        "POST /orders", kind=SpanKind.SERVER, attributes={"deadline.remaining_ms": 250}
    ) as hop:
        with tracer.start_as_current_span(
            "inventory.Reserve",
            kind=SpanKind.CLIENT,
            attributes={"rpc.grpc.request.metadata.grpc-timeout": ["850m"], "rpc.system": "grpc"},
        ) as call:
            call.set_status(Status(StatusCode.ERROR, "DEADLINE_EXCEEDED"))
        trace_id = format(hop.get_span_context().trace_id, "032x")
    provider.shutdown()
    print(trace_id)


if __name__ == "__main__":
    main()
