"""Backtests: replay traces through the simulator, run kvwatch and baselines on the same polls, score them."""
