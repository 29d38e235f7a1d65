"""Run reports: one self-contained HTML page per run (``michelangelo runs report``)."""

from michelangelo.uniflow.report._html import build_report, write_report

__all__ = ["build_report", "write_report"]
