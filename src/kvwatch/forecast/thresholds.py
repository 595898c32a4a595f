"""The figures every part of the forecaster shares, written once: the usage forecasts aim at, the usage from which a
queue means the KV cache is the limit, and the length of the buckets the polls are summarised in. ForecastParams
hands them to its parts; these are only their defaults. And the queue one poll can trust, which ``kvwatch check``'s
``scheduler_limited`` finding and the sidecar's state both read; and how a limit in whole requests is rounded."""

import math

SATURATION_USAGE = 0.95
BUSY_USAGE = 0.90
BUCKET_SECONDS = 60.0

# One poll cannot see a queue persist: a standing queue is at least this many requests and this share of the running
# ones (a request or two arriving between scheduler steps wait for a moment at any load; at hundreds of requests a
# second a few wait at nearly every poll of a healthy engine, which read scheduler_limited).
STANDING_QUEUE_MIN_WAITING = 2
STANDING_QUEUE_MIN_SHARE = 0.1


def standing_queue(waiting: float | None, running: float | None) -> bool:
    """Whether ``waiting`` requests beside ``running`` ones are a queue one poll can trust (False with either
    unknown: the queue's share of the running requests is not known)."""
    if not waiting or running is None:
        return False
    return waiting >= max(STANDING_QUEUE_MIN_WAITING, STANDING_QUEUE_MIN_SHARE * running)


def queue_waits_for_kv(usage: float, waiting: float | None, running: float | None, *, no_room: bool,
                       saturation: float = SATURATION_USAGE, busy: float = BUSY_USAGE) -> bool:
    """Whether the requests waiting wait for the KV cache: any queue at ``saturation`` used, a standing one from
    ``busy`` (below the saturation a few arrivals waiting for the next step fit: one request beside 300 running at
    0.91 read as a full cache), and any where the next prompt does not fit (``no_room``)."""
    if not waiting or waiting < 1:
        return False
    return usage >= saturation or (usage >= busy and standing_queue(waiting, running)) or no_room


def whole_requests(room: float) -> int:
    """A concurrency limit from ``room`` (requests, a float): floored, at least 1, but never below a whole number the
    float arithmetic left a hair under it (0.95 × 24 / 0.95 is 23.999...: the limit read 23 beside a ceiling whose
    95 % is 24, and 24 requests of that size fill exactly 95 % of the cache)."""
    return max(1, math.floor(room * (1.0 + 1e-9)))
