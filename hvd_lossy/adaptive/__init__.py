"""Dual-level adaptive error bounds (Feng et al., SC'24): per table, and per iteration.

``Controller`` holds per-table bounds chosen by a policy from statistics exchanged across ranks,
times a schedule multiplier; ``AdaptiveCompressor`` applies them to the embedding all-to-all.
See ``schedules``, ``policies``, ``controller``, ``compressor`` and ``telemetry``.
"""

from .compressor import AdaptiveCompressor
from .controller import Controller, TableSpec
from .policies import (POLICIES, BudgetPolicy, PaperPolicy, Policy, SensitivityPolicy,
                       UniformPolicy, make_policy)
from .schedules import SCHEDULES, multiplier
from .stats import TableStats
from .telemetry import plot_telemetry, read_lines as read_telemetry

__all__ = ["Controller", "TableSpec", "TableStats", "AdaptiveCompressor", "multiplier",
           "SCHEDULES", "POLICIES", "Policy", "UniformPolicy", "PaperPolicy",
           "SensitivityPolicy", "BudgetPolicy", "make_policy", "plot_telemetry",
           "read_telemetry"]

