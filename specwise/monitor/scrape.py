"""GET a /metrics page and read it, or say in one line why not.

Every failure is a `ScrapeError` with a message naming the URL:
  - "cannot connect" (refused, DNS, timeout), with the transport's reason;
  - "HTTP 404" and other non-200 answers;
  - the page is not a Prometheus exposition, or has no speculative figures (exposition.py).
The monitor reports these per window and carries on; nothing here raises anything else.
"""

import time

import httpx

from specwise.errors import InputError
from specwise.monitor.exposition import ExpositionError, Snapshot, parse_snapshot

DEFAULT_TIMEOUT_S = 10.0


class ScrapeError(InputError):
    """A scrape that gave no snapshot; the message is complete and names the URL."""


def scrape(client: httpx.Client, url: str, timeout: float = DEFAULT_TIMEOUT_S, clock=time.time) -> Snapshot:
    read_at = clock()
    try:
        response = client.get(url, timeout=timeout)
    except httpx.TimeoutException:
        raise ScrapeError(f"{url}: cannot connect (no answer within {timeout:g} s)") from None
    except httpx.HTTPError as error:
        raise ScrapeError(f"{url}: cannot connect ({_reason(error)})") from None
    if response.status_code != 200:
        raise ScrapeError(f"{url}: HTTP {response.status_code} (expected 200 from a /metrics page)")
    try:
        return parse_snapshot(response.text, read_at, where=url)
    except ExpositionError as error:
        raise ScrapeError(str(error)) from None


def _reason(error: httpx.HTTPError) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:160]
