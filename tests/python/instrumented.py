"""Runs docs/snippets/budget.py as docs/instrument.md shows it: two WSGI services,
checkout → inventory, each with BudgetMiddleware and its own tracer provider exporting
over OTLP/HTTP to budgetscope. Sends one request with an 800 ms budget and one with 15 ms
(checkout fails fast without calling), and prints each answer's status.

Usage: instrumented.py OTLP_HTTP_BASE_URL
"""

import os
import sys
import threading
import time
import urllib.error
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "docs", "snippets"))
from budget import BudgetMiddleware, DeadlineExceeded, post_with_budget  # noqa: E402

endpoint = sys.argv[1].rstrip("/") + "/v1/traces"


def provider(service):
    p = TracerProvider(resource=Resource.create({"service.name": service}))
    p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return p


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def serve(app):
    server = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}"


inventory_provider, checkout_provider = provider("py-inventory"), provider("py-checkout")
inventory_tracer = inventory_provider.get_tracer("instrumented")
checkout_tracer = checkout_provider.get_tracer("instrumented")


def inventory(environ, start_response):
    time.sleep(0.02)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"reserved"]


inventory_url = serve(BudgetMiddleware(inventory, inventory_tracer))


def checkout(environ, start_response):
    try:
        post_with_budget(checkout_tracer, inventory_url + "/reserve", environ["budget.deadline"])
    except DeadlineExceeded:
        start_response("504 Gateway Timeout", [("Content-Type", "text/plain")])
        return [b"out of budget"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ordered"]


checkout_url = serve(BudgetMiddleware(checkout, checkout_tracer))

for budget in ("800", "15"):
    request = urllib.request.Request(
        checkout_url + "/checkout", data=b"", method="POST", headers={"X-Request-Budget-Ms": budget}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            print(budget, response.status)
    except urllib.error.HTTPError as error:
        print(budget, error.code)

inventory_provider.shutdown()
checkout_provider.shutdown()
