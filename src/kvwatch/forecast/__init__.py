"""KV-cache exhaustion forecast, bottleneck detection and the state machine (pure, clock-free).

Entry point: ``Forecaster(ForecastParams()).observe(ForecastSample(...)) -> ForecastResult``;
``forecast_metric_families`` in :mod:`kvwatch.serve.forecast_export` turns a result into ``kvwatch_*`` metrics.
"""

from kvwatch.forecast.detector import STATES
from kvwatch.forecast.forecaster import (
    HORIZONS_SECONDS,
    Forecaster,
    ForecastParams,
    ForecastResult,
    ForecastSample,
)

__all__ = ["HORIZONS_SECONDS", "STATES", "ForecastParams", "ForecastResult", "ForecastSample", "Forecaster"]
