"""Deadline budgets for budgetscope: record `deadline.remaining_ms` on server and client
spans, forward what is left, and fail fast when too little is left.

BudgetMiddleware wraps any WSGI app (Flask: `app.wsgi_app = BudgetMiddleware(app.wsgi_app,
tracer)`; Django: wrap `get_wsgi_application()`). post_with_budget makes an HTTP call
within the request's budget. DeadlineMetrics, given to BudgetMiddleware, also records the
deadline metrics, which count every request when traces are sampled.
"""

import contextvars
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


# The calls of the current request whose callee ran out of budget (BudgetMiddleware sets it).
_callee_exceeded = contextvars.ContextVar("callee_exceeded", default=None)


def _budget_ms(value):
    try:
        budget = float(value)
    except (TypeError, ValueError):
        return None
    return budget if math.isfinite(budget) else None


class DeadlineMetrics:
    """The deadline metrics of a service's hops, from an OpenTelemetry meter."""

    def __init__(self, meter):
        self.received = meter.create_histogram("deadline.budget_received", unit="ms")
        self.remaining = meter.create_histogram("deadline.budget_remaining", unit="ms")
        self.exceeded = meter.create_counter("deadline.exceeded")

    def answered(self, hop, budget_ms, deadline, status, passed_on=False):
        """Records one request `hop` answered with HTTP `status`. A 504 is this hop's
        exceed when the request arrived with nothing left (inherited) or the deadline
        passed here (local); a 504 `passed_on` from a callee is the callee's to count."""
        remaining_ms = (deadline - time.monotonic()) * 1000
        # Histograms take no negative values (the SDK drops them): a spent budget is 0.
        self.received.record(max(budget_ms, 0), {"hop": hop})
        self.remaining.record(max(remaining_ms, 0), {"hop": hop})
        if status == 504 and budget_ms <= 0:
            self.exceeded.add(1, {"hop": hop, "origin": "inherited"})
        elif status == 504 and remaining_ms <= 0 and not passed_on:
            self.exceeded.add(1, {"hop": hop, "origin": "local"})


class BudgetMiddleware:
    """Starts each request's SERVER span with the budget it received and puts the request's
    deadline (a time.monotonic() value) in environ["budget.deadline"]; with `metrics` (a
    DeadlineMetrics), records each answered request there too."""

    def __init__(self, app, tracer, default_budget_ms=None, metrics=None):
        self.app = app
        self.tracer = tracer
        self.default_budget_ms = default_budget_ms  # for edge services: a request budget
        self.metrics = metrics

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

        answered = []

        def recording_start_response(status, response_headers, exc_info=None):
            code = int(status.split()[0])
            answered.append(code)
            span.set_attribute("http.response.status_code", code)
            if code >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            return start_response(status, response_headers, exc_info)

        token = context.attach(trace.set_span_in_context(span))
        callee_exceeded = []
        callee_token = _callee_exceeded.set(callee_exceeded)
        try:
            # Apps that stream their body keep working after this returns; the span
            # ends when the app returns its iterable.
            return self.app(environ, recording_start_response)
        finally:
            _callee_exceeded.reset(callee_token)
            context.detach(token)
            span.end()
            if self.metrics is not None and budget is not None and answered:
                self.metrics.answered(
                    f"{method} {path}",
                    budget,
                    environ["budget.deadline"],
                    answered[-1],
                    passed_on=bool(callee_exceeded),
                )


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
                _note_callee_exceeded(url)
                raise DeadlineExceeded(f"{url} ran out of budget") from error
            raise
        except (urllib.error.URLError, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            if not isinstance(reason, (socket.timeout, TimeoutError)):
                raise
            span.set_attribute("error.type", "timeout")
            _note_callee_exceeded(url)
            raise DeadlineExceeded(f"gave up on {url} after {remaining:.0f} ms") from error


def _note_callee_exceeded(url):
    calls = _callee_exceeded.get()
    if calls is not None:
        calls.append(url)
