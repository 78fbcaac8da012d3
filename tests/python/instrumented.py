"""Runs docs/snippets/budget.py as docs/instrument.md shows it: two WSGI services,
checkout → inventory, each with BudgetMiddleware, DeadlineMetrics and its own tracer and
meter providers exporting over OTLP/HTTP to budgetscope. Sends requests with budgets of
800 ms, 15 ms (checkout fails fast without calling), -5 ms (arrives spent) and 100 ms
(forwarded to inventory, whose 100 ms of work outlasts it), and prints each answer's
status.

Usage: instrumented.py OTLP_HTTP_BASE_URL
"""

import os
import sys
import threading
import time
import urllib.error
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "docs", "snippets"))
from budget import (  # noqa: E402
    BudgetMiddleware,
    DeadlineExceeded,
    DeadlineMetrics,
    post_with_budget,
)

base = sys.argv[1].rstrip("/")


def provider(service):
    p = TracerProvider(resource=Resource.create({"service.name": service}))
    p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=base + "/v1/traces")))
    return p


def meter_provider(service):
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=base + "/v1/metrics"))
    return MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": service})
    )


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
inventory_meters, checkout_meters = meter_provider("py-inventory"), meter_provider("py-checkout")
inventory_metrics = DeadlineMetrics(inventory_meters.get_meter("instrumented"))
checkout_metrics = DeadlineMetrics(checkout_meters.get_meter("instrumented"))


def inventory(environ, start_response):
    # 20 ms of work, or 100 ms for a request marked slow, then a deadline check.
    time.sleep(0.1 if environ.get("QUERY_STRING") == "slow" else 0.02)
    if time.monotonic() > environ["budget.deadline"]:
        start_response("504 Gateway Timeout", [("Content-Type", "text/plain")])
        return [b"out of budget"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"reserved"]


inventory_app = BudgetMiddleware(inventory, inventory_tracer, metrics=inventory_metrics)
slow_request_recorded = threading.Event()


def inventory_served(environ, start_response):
    try:
        return inventory_app(environ, start_response)
    finally:
        if environ.get("QUERY_STRING") == "slow":
            slow_request_recorded.set()


inventory_url = serve(inventory_served)


def checkout(environ, start_response):
    try:
        slow = environ.get("QUERY_STRING") == "slow"
        url = inventory_url + ("/reserve?slow" if slow else "/reserve")
        post_with_budget(checkout_tracer, url, environ["budget.deadline"])
    except DeadlineExceeded:
        start_response("504 Gateway Timeout", [("Content-Type", "text/plain")])
        return [b"out of budget"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ordered"]


checkout_url = serve(BudgetMiddleware(checkout, checkout_tracer, metrics=checkout_metrics))

for budget, query in (("800", ""), ("15", ""), ("-5", ""), ("100", "?slow")):
    request = urllib.request.Request(
        f"{checkout_url}/checkout{query}",
        data=b"",
        method="POST",
        headers={"X-Request-Budget-Ms": budget},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            print(budget, response.status)
    except urllib.error.HTTPError as error:
        print(budget, error.code)

# Inventory works on after checkout stopped waiting for the slow request; its span and
# metrics are recorded before the providers send what they hold.
if not slow_request_recorded.wait(30):
    sys.exit("inventory never finished the slow request")
for p in (inventory_provider, checkout_provider, inventory_meters, checkout_meters):
    p.shutdown()
