"""Maintenance scripts run from the checkout (`python tools/NAME.py`); a package so that tests import them as
`from tools import NAME` (pyproject.toml's pytest pythonpath puts the root on sys.path)."""
