"""The figures every part of the forecaster shares, written once: the usage forecasts aim at, the usage from which a
queue means the KV cache is the limit, and the length of the buckets the polls are summarised in. ForecastParams
hands them to its parts; these are only their defaults."""

SATURATION_USAGE = 0.95
BUSY_USAGE = 0.90
BUCKET_SECONDS = 60.0
