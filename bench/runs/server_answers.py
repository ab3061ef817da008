"""What an MLflow tracking server answered, in words: an error status during the work (:class:`ServerError`: named by
MLflow's API request, with what to do for that status), and, before any work (``bench.runs.store_check.check_api``),
an answer that shows the address is not a working MLflow server: a redirect loop, JSON of another shape, a body cut
off, a rate limit (held-out round 11: H06, H07, H08, H09).
"""

from __future__ import annotations

import http
import re
import urllib.error
import urllib.request

from bench import faults


class ServerError(faults.StoreRefused):
    """The MLflow server answered a request with an error status (HTTP 500: its database or storage failed; 429: too
    many requests). During a training run it is met as a lost server is: the run's end recorded in ``run.json`` when
    the server does not take it, the checkpoint kept, the resume command said (bench/runs/lifecycle.py)."""


def status_advice(status: int, retry_after: str | None = None) -> str:
    """``(<what the status means>): <what to do>`` for an error status an MLflow server answered with."""
    if status == 429:
        wait = f"; it asks to wait {retry_after} s" if retry_after else ""
        return (f"(Too Many Requests: it limits how often it is asked{wait}): wait, then rerun the same command; or "
                "ask its administrator to raise the limit for this client")
    if status >= 500:
        return "(its log says why: its database or storage failed, say): fix the server, then rerun"
    return f"({_phrase(status)}): fix --tracking-uri / MLFLOW_TRACKING_URI, or the server (its log says why)"


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "an error status"


def refused_status(uri: str, e: BaseException, status: int) -> ServerError:
    """The one line of an error status (:func:`bench.faults.answered_status`) the server ``uri`` answered ``e``'s
    request with: the request named as MLflow's API names it (``runs/update``), not by pobench's function that sent
    it (held-out round 11, H09: "answered retry_locked with HTTP 500")."""
    return ServerError(f"the MLflow server {uri} answered {api_request(e)} with HTTP {status} {status_advice(status)}")


def api_request(e: BaseException) -> str:
    """Which request of MLflow's API ``e`` (MLflow's error, whose text names the URL) was: ``its API request
    runs/update``; ``a request`` when its text names none."""
    for c in faults._chain(e):
        m = re.search(r"/api/2\.0/(mlflow(?:-artifacts)?)/([A-Za-z0-9_./-]+)", str(c))
        if m:
            return f"its API request {m.group(2) if m.group(1) == 'mlflow' else 'artifacts (a file of a run)'}"
    return "a request"


def retry_after(uri: str, timeout: float) -> str | None:
    """The ``Retry-After`` header the server ``uri`` answers its API's experiments/search with (a rate limit says
    how long to wait); None when it sends none or does not answer."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1",
                                    timeout=timeout):
            return None
    except urllib.error.HTTPError as e:
        value = e.headers.get("Retry-After") if e.headers is not None else None
        return value.strip()[:40] if value else None
    except (OSError, ValueError):
        return None


def not_mlflow(uri: str, e: BaseException, timeout: float, cut_off: str | None) -> str | None:
    """The one line (before any work) of an answer of the server ``uri`` to MLflow's API that shows it is not a
    working MLflow server, or None when ``e`` is none of those: a redirect loop (a misconfigured proxy), JSON of
    another shape (another service), a rate limit or another error status, a body cut off (``cut_off``: how the
    connection ended, when ``e`` is a request that got no whole answer)."""
    import requests

    chain = list(faults._chain(e))
    fix = "fix --tracking-uri / MLFLOW_TRACKING_URI"
    if any(isinstance(c, requests.exceptions.TooManyRedirects) for c in chain):
        return (f"{uri} answered the MLflow API with a redirect loop (Exceeded 30 redirects): not an MLflow tracking "
                f"server as given; {fix} (the address the redirect should reach), or the proxy in front of it")
    if any(type(c).__name__ == "ParseError" for c in chain):
        return (f"{uri} answered the MLflow API with JSON that is not MLflow's ({faults._first(str(chain[0]))[:120]})"
                f": it is not an MLflow tracking server (or one of another API); {fix}")
    if (status := faults.answered_status(e)) is not None:
        after = retry_after(uri, timeout) if status == 429 else None
        return f"the MLflow tracking server {uri} answered its API with HTTP {status} {status_advice(status, after)}"
    if cut_off is not None:
        return (f"the MLflow tracking server {uri} answered the MLflow API with an answer cut off ({cut_off}):"
                f" it is not a working MLflow tracking server; {fix}, or the server")
    return None
