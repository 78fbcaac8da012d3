"""Deadline budgets for budgetscope: record `deadline.remaining_ms` on server and client
spans, forward what is left, and fail fast when too little is left.

BudgetMiddleware wraps any WSGI app (Flask: `app.wsgi_app = BudgetMiddleware(app.wsgi_app,
tracer)`; Django: wrap `get_wsgi_application()`). post_with_budget makes an HTTP call
within the request's budget.
"""

import math
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from opentelemetry import context, trace
from opentelemetry.propagate import extract, inject

BUDGET_HEADER = "X-Request-Budget-Ms"
RESERVE_MS = 10  # kept back from what is left, for this hop's own answer
MIN_CALL_MS = 20  # with less left, fail fast instead of calling


class DeadlineExceeded(Exception):
    """Too little budget left: answer 504 (HTTP) or DEADLINE_EXCEEDED (gRPC)."""


def _budget_ms(value):
    try:
        budget = float(value)
    except (TypeError, ValueError):
        return None
    return budget if math.isfinite(budget) else None


class BudgetMiddleware:
    """Starts each request's SERVER span with the budget it received and puts the request's
    deadline (a time.monotonic() value) in environ["budget.deadline"]."""

    def __init__(self, app, tracer, default_budget_ms=None):
        self.app = app
        self.tracer = tracer
        self.default_budget_ms = default_budget_ms  # for edge services: a request budget

    def __call__(self, environ, start_response):
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        budget = _budget_ms(headers.get(BUDGET_HEADER.lower()))
        if budget is None:
            budget = self.default_budget_ms
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO") or "/"
        span = self.tracer.start_span(
            f"{method} {path}",
            context=extract(headers),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )
        if budget is not None:
            span.set_attribute("deadline.remaining_ms", budget)
            environ["budget.deadline"] = time.monotonic() + budget / 1000

        def recording_start_response(status, response_headers, exc_info=None):
            code = int(status.split()[0])
            span.set_attribute("http.response.status_code", code)
            if code >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            return start_response(status, response_headers, exc_info)

        token = context.attach(trace.set_span_in_context(span))
        try:
            # Apps that stream their body keep working after this returns; the span
            # ends when the app returns its iterable.
            return self.app(environ, recording_start_response)
        finally:
            context.detach(token)
            span.end()


def post_with_budget(tracer, url, deadline, body=b""):
    """POSTs `body` to `url` as a CLIENT span, forwarding what is left of `deadline` minus
    RESERVE_MS in X-Request-Budget-Ms and waiting no longer than that."""
    remaining = (deadline - time.monotonic()) * 1000 - RESERVE_MS
    if remaining < MIN_CALL_MS:
        raise DeadlineExceeded(f"{remaining:.0f} ms left: not calling {url}")
    parts = urllib.parse.urlsplit(url)
    attributes = {
        "deadline.remaining_ms": round(remaining),
        "http.request.method": "POST",
        "url.full": url,
        "server.address": parts.hostname or "",
    }
    with tracer.start_as_current_span(
        f"POST {parts.path or '/'}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        headers = {BUDGET_HEADER: str(round(remaining))}
        inject(headers)
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=remaining / 1000) as response:
                span.set_attribute("http.response.status_code", response.status)
                return response.read()
        except urllib.error.HTTPError as error:
            span.set_attribute("http.response.status_code", error.code)
            if error.code == 504:
                raise DeadlineExceeded(f"{url} ran out of budget") from error
            raise
        except (urllib.error.URLError, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            if not isinstance(reason, (socket.timeout, TimeoutError)):
                raise
            span.set_attribute("error.type", "timeout")
            raise DeadlineExceeded(f"gave up on {url} after {remaining:.0f} ms") from error
