"""Wires the verify pytest plugin for in-repo runs.

Installed (``make setup``), the plugin comes in through its pytest11 entry point; run from
a bare checkout, this file puts the repo on sys.path and loads the plugin itself.
"""
import os
import sys
from importlib.metadata import entry_points

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _entry_point_active() -> bool:
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == "verify.pytest_plugin" for ep in entry_points(group="pytest11"))


if not _entry_point_active():
    pytest_plugins = ["verify.pytest_plugin"]
